"""NIXL READ throughput between two processes on one host, through `NixlPeerTransport`.

A producer process (spawned) holds a /dev/shm `ShmRegion` filled with a seeded pattern and a NIXL
agent; this process holds its own region and agent, adds the producer as a peer and READs
payloads of 1, 9 and 32 MiB as 1 run or as 64 runs (scattered with gaps on the producer side,
dealt out in shuffled order on ours), for UCX error-handling mode `none` and `peer` (both agents in
the same mode), with the reading agent's NIXL progress thread off (progress only from polling
`read_state`) and on (the producer always runs one: without it the connection never comes up),
and for each progress-thread delay of --progress-delays (NIXL's `pthrDelay`, both agents: 0 spins,
the transport's default waits in poll() up to 1 ms when no UCX event wakes it).
Time = `start_read` until `read_state` says DONE (busy polling), median of --reps
after --warmup reads; GiB/s = 2**30 B/s. Beside it, a plain in-process copy of the same bytes
(numpy, between two mappings) for scale. Every read's bytes are verified against the pattern.

    python bench/nixl_read.py                             # both modes, progress thread off and on
    UCX_TLS=tcp,self python bench/nixl_read.py --modes none  # the environment reaches both processes

It also prints the CPU an idle agent burns without its progress thread and with it at each delay.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    Child,
    MiB,
    local_copy_gibs,
    pattern,
    scratch_shm_dir,
    wait_for_stop,
    wait_read,
)
from ec_connector.adapters.nixl_data.transport import PROGRESS_DELAY_US  # noqa: E402
from ec_connector.adapters.shm import ShmRegion  # noqa: E402
from ec_connector.domain.layout import Layout  # noqa: E402
from ec_connector.ports.peer import ReadState  # noqa: E402

PAYLOADS_MIB = (1, 9, 32)
RUNS = (1, 64)
AREA = Layout(hidden_dim=512, dtype="bfloat16", num_blocks=80 * 1024)  # 1 KiB rows, 80 MiB


def producer_main(name: str, mode: str, delay_us: int, shm_dir: str, conn) -> None:  # the spawned child
    from ec_connector.adapters.nixl_data import NixlPeerTransport

    region = ShmRegion.open(instance=name, dp_rank=0, layout=AREA, shm_dir=shm_dir, populate=True)
    view = region.data()
    np.frombuffer(view, dtype=np.uint8)[:] = pattern(AREA.data_bytes)
    view.release()
    transport = NixlPeerTransport(
        region, agent_name=name, ucx_error_mode=mode, progress_thread=True, progress_delay_us=delay_us
    )
    conn.send(transport.agent_metadata())
    wait_for_stop(conn)  # until the parent is done
    transport.close()
    region.close()


def layouts(
    payload: int, runs: int, rng: random.Random
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Remote runs with a one-run gap between them; local runs in shuffled slots, no gaps."""
    n = payload // runs
    remote = [(2 * i * n, n) for i in range(runs)]
    slots = list(range(runs))
    rng.shuffle(slots)
    local = [(s * n, n) for s in slots]
    return remote, local


def timed_read(transport, peer: str, remote, local, timeout_s: float = 30.0) -> float:
    t0 = time.perf_counter()
    handle = transport.start_read(peer, remote, local)
    state, _ = wait_read(transport, handle, bound_s=timeout_s)
    dt = time.perf_counter() - t0
    transport.release(handle)
    if state is ReadState.PENDING:
        raise TimeoutError("READ still pending")
    if state is not ReadState.DONE:
        raise RuntimeError(f"READ ended {state}")
    return dt


def verify(region: ShmRegion, remote, local, src: np.ndarray) -> None:
    view = region.data()
    dst = np.frombuffer(view, dtype=np.uint8)
    try:
        for (ro, n), (lo, _) in zip(remote, local, strict=True):
            if not np.array_equal(dst[lo : lo + n], src[ro : ro + n]):
                raise AssertionError(f"bytes differ in local run at {lo}")
        dst[:] = 0  # so stale bytes cannot pass the next check
    finally:
        del dst
        view.release()


def run_mode(mode: str, pthread: bool, delay_us: int, args, shm_dir: Path) -> list[tuple]:
    from ec_connector.adapters.nixl_data import NixlPeerTransport

    peer = f"bench-prod-{mode}"
    producer = Child(producer_main, peer, mode, delay_us, str(shm_dir))
    metadata = producer.start()
    region = ShmRegion.open(
        instance=f"bench-cons-{mode}", dp_rank=0, layout=AREA, shm_dir=shm_dir, populate=True
    )
    transport = NixlPeerTransport(
        region,
        agent_name=f"bench-cons-{mode}",
        ucx_error_mode=mode,
        progress_thread=pthread,
        progress_delay_us=delay_us,
    )
    src = pattern(AREA.data_bytes)
    rows = []
    try:
        t0 = time.perf_counter()
        transport.add_peer(peer, metadata)
        added = time.perf_counter() - t0
        first = timed_read(transport, peer, [(0, 4 * MiB)], [(0, 4 * MiB)])
        label = f"{mode}, consumer progress thread {'on' if pthread else 'off'}, delay {delay_us} us"
        print(f"[{label}] add_peer {1e3 * added:.1f} ms, first 4 MiB READ {1e3 * first:.1f} ms", flush=True)
        rng = random.Random(1)
        for mib in PAYLOADS_MIB:
            for runs in RUNS:
                remote, local = layouts(mib * MiB, runs, rng)
                times = []
                for _ in range(args.warmup + args.reps):
                    times.append(timed_read(transport, peer, remote, local))
                    verify(region, remote, local, src)
                med = statistics.median(times[args.warmup :])
                rows.append(
                    (
                        mode,
                        "on" if pthread else "off",
                        delay_us,
                        mib,
                        runs,
                        med * 1e3,
                        mib * MiB / med / 2**30,
                    )
                )
    finally:
        transport.close()
        region.close()
        producer.stop()
    return rows


def idle_cpu(shm_dir: Path, pthread: bool, delay_us: int, seconds: float = 2.0) -> float:
    """CPU seconds per second this process burns while an agent sits idle."""
    from ec_connector.adapters.nixl_data import NixlPeerTransport

    small = Layout(hidden_dim=512, dtype="bfloat16", num_blocks=64)
    with ShmRegion.open(instance=f"bench-idle-{pthread}", dp_rank=0, layout=small, shm_dir=shm_dir) as region:
        transport = NixlPeerTransport(
            region, agent_name=f"bench-idle-{pthread}", progress_thread=pthread, progress_delay_us=delay_us
        )
        time.sleep(0.2)
        c0, t0 = time.process_time(), time.perf_counter()
        time.sleep(seconds)
        busy = (time.process_time() - c0) / (time.perf_counter() - t0)
        transport.close()
    return busy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=["none", "peer"], choices=["none", "peer"])
    ap.add_argument(
        "--consumer-progress-thread",
        nargs="+",
        default=["off", "on"],
        choices=["off", "on"],
        help="NIXL progress thread in the reading agent (the producer always runs one)",
    )
    ap.add_argument(
        "--progress-delays",
        nargs="+",
        type=int,
        default=[0, PROGRESS_DELAY_US],
        help="NIXL progress-thread delays in us, both agents (0 spins; default: 0 and the transport's)",
    )
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    with scratch_shm_dir() as shm_dir:
        print(f"UCX_TLS={os.environ.get('UCX_TLS', '(unset)')}  cpus={os.cpu_count()}", flush=True)
        print(f"idle agent, progress thread off: {idle_cpu(shm_dir, False, 0):.2f} CPU s/s", flush=True)
        for delay in args.progress_delays:
            busy = idle_cpu(shm_dir, True, delay)
            print(f"idle agent, progress thread on, delay {delay} us: {busy:.2f} CPU s/s", flush=True)
        rows = [
            row
            for mode in args.modes
            for pthread in args.consumer_progress_thread
            for delay in args.progress_delays
            for row in run_mode(mode, pthread == "on", delay, args, shm_dir)
        ]
    print(
        f"{'mode':<5} {'pthr':>4} {'delay us':>8} {'MiB':>4} {'runs':>4} {'ms':>8} {'GiB/s':>7} "
        f"{'local copy GiB/s':>17}"
    )
    for mode, pthread, delay, mib, runs, ms, gibs in rows:
        local = local_copy_gibs(mib * MiB, 5)
        print(f"{mode:<5} {pthread:>4} {delay:>8} {mib:>4} {runs:>4} {ms:>8.2f} {gibs:>7.2f} {local:>17.2f}")


if __name__ == "__main__":
    main()
