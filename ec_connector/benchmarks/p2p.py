"""E→PD transfer on one host through our own P2P flow: producer and consumer in two processes.

A spawned producer process builds the producer side exactly as an engine does (the container:
/dev/shm region, entry table, NIXL agent, ZMQ side channel answered by the `ProducerDesk`) and
holds one READY entry of each size (bytes of a seeded pattern written where a save would put
them), published with `ec_transfer_params`. This process is the consumer (the container again:
its own region, NIXL agent, ZMQ client, `ConsumerFetcher`) and, per UCX error mode (`none`,
`peer`; both ends in the same mode), for entries of 1, 9 and 32 MiB (4 KiB rows, hidden 2048 bf16):

- flow: XferReq → XferAck (ack round trip) → NIXL READ of the granted runs into a reservation of
  its own region (READ time) → XferDone; end to end = request sent until done sent. Beside each
  READ, a plain copy of the same bytes into the same destination (numpy memcpy, this process),
  in the same iteration; ratio = READ GiB/s / memcpy GiB/s (medians). Every READ is verified.
- fetcher: `ConsumerFetcher.ensure_available` then `poll` (busy, no engine step in between)
  until the entry is READY: the end-to-end time of the service an engine runs.
- ack loop: request → ack → done for the 1 MiB entry, many times (p50/p99 of the round trip).
- producer death: a 1 GiB READ (the entry's runs 32 times) is in flight when the producer is
  SIGKILLed; how long until the READ reports FAILED (or that it stays PENDING, bounded), over
  the default transports and over TCP loopback (`UCX_TLS=tcp,self` in both processes).
- hung producer: the producer acks, then is SIGSTOPped; the consumer READs from it (first READ of
  a fresh agent pair): DONE, or PENDING until the bound.

All consumer agents keep NIXL's progress thread on, as the connector's do. Times are wall clock
(`perf_counter`); p99 of fewer than 100 samples is their maximum. GiB = 2**30 bytes.

    .venv/bin/python -m ec_connector.benchmarks.p2p                       # full run (~4 min on 2 cores)
    .venv/bin/python -m ec_connector.benchmarks.p2p --quick --json out.json

`run(sizes, modes, iterations, progress=None)` returns every figure as a dict (what --json writes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ec_connector.application.consumer import WantedItem
from ec_connector.benchmarks.common import (
    Child,
    MiB,
    copy_seconds,
    gibs,
    pattern,
    percentile,
    scratch_shm_dir,
    wait_for_stop,
    wait_read,
)
from ec_connector.benchmarks.p2p_report import outcomes as describe_outcomes
from ec_connector.benchmarks.p2p_report import print_report
from ec_connector.container import build_container
from ec_connector.domain.protocol import PROTOCOL_VERSION, AckStatus, XferAck, XferDone, XferReq
from ec_connector.domain.publish import PeerAddress
from ec_connector.logging import attach_stderr_handler, configure_logging
from ec_connector.ports.peer import ReadState

SIZES_MIB = (1, 9, 32)
MODES = ("none", "peer")
HIDDEN_DIM = 2048  # bf16: 4 KiB rows
DTYPE = "bfloat16"
FINGERPRINT = "bench-p2p"
HOST = "127.0.0.1"
DEATH_REPEAT = 16  # the in-flight READ reads the 32 MiB entry this many times (512 MiB)
# (UCX_TLS, when the producer is killed): over the default transports a same-host READ is a cma
# copy done inside start_read, so only TCP leaves a READ in flight for a kill to hit.
DEATH_CASES = (("tcp", "mid_read"), ("default", "before_read"), ("default", "mid_read"))
ACK_TIMEOUT_S = 10.0
Progress = Callable[[str], None]


def item_key(mib: int) -> str:
    return f"item-{mib}mib"


def _quiet_logs() -> None:
    configure_logging(level="WARNING")
    attach_stderr_handler()


def _settings(role: str, instance: str, mode: str, shm_dir: str, region_bytes: int, **more: Any) -> dict:
    extra = {"ec_cpu_bytes": region_bytes, "ec_enable_nixl": True, "ucx_error_mode": mode}
    return {
        "role": role,
        "extra": extra,
        "instance": instance,
        "hidden_dim": HIDDEN_DIM,
        "dtype": DTYPE,
        "participants": 1,
        "shm_dir": shm_dir,
        "fingerprint": FINGERPRINT,
        **more,
    }


def producer_main(instance: str, mode: str, shm_dir: str, port: int, sizes: Sequence[int], conn) -> None:
    """The producer process: entries of `sizes` MiB, served through the desk until told to stop."""
    _quiet_logs()
    region_bytes = (sum(sizes) + 1) * MiB
    container = build_container(
        **_settings("ec_producer", instance, mode, shm_dir, region_bytes, side_host=HOST, side_port=port)
    )
    try:
        tier, clock = container.tier_scheduler(), container.clock()
        desk = container.producer_desk()
        container.control_server().start(desk.answer, desk.done)
        layout = tier.layout
        view = container.region().data()
        data = np.frombuffer(view, dtype=np.uint8)
        items = {}
        for mib in sizes:
            rows = mib * MiB // layout.block_size_bytes
            src, pos = pattern(mib * MiB, seed=mib), 0
            reservation = tier.reserve_fetch(item_key(mib), rows, now=clock.now(), lease_s=60.0)
            assert reservation is not None
            for off, n in layout.byte_runs(reservation.entry.extents):
                data[off : off + n] = src[pos : pos + n]
                pos += n
            tier.finish_fetch(item_key(mib))
            items[item_key(mib)] = {"image_grid_thw": [1, 2, 2 * rows]}  # placeholder of `rows` tokens
        del data
        view.release()
        conn.send({"params": desk.publish(items), "pid": os.getpid()})
        wait_for_stop(conn)
    finally:
        container.shutdown_resources()


_PORTS_USED: set[int] = set()


def free_port() -> int:
    """A free TCP port not handed out before in this run (a killed producer's port may linger in
    the consumer's control client until it reports the loss)."""
    while True:
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port not in _PORTS_USED:
            _PORTS_USED.add(port)
            return port


def _transport_resource(region, config, agent_name: str, progress_thread: bool):  # noqa: ANN001, ANN202
    from ec_connector.adapters.nixl_data import NixlPeerTransport

    transport = NixlPeerTransport(
        region,
        agent_name=agent_name,
        backend=config.backend,
        ucx_error_mode=config.ucx_error_mode,
        progress_thread=progress_thread,
    )
    try:
        yield transport
    finally:
        transport.close()


@contextlib.contextmanager
def ucx_tls(value: str | None) -> Iterator[None]:
    """UCX_TLS for agents created (and producers spawned) inside the block; None keeps it as is."""
    old = os.environ.get("UCX_TLS")
    if value is not None:
        os.environ["UCX_TLS"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("UCX_TLS", None)
        else:
            os.environ["UCX_TLS"] = old


class Consumer:
    """The consumer side, built by the container as an `ec_consumer` engine builds it."""

    def __init__(
        self, instance: str, mode: str, shm_dir: Path, region_bytes: int, *, progress_thread: bool = True
    ) -> None:
        self.name = instance
        self.container = build_container(
            **_settings("ec_consumer", instance, mode, str(shm_dir), region_bytes)
        )
        if not progress_thread:  # the container's agent always runs one; swap in one without
            from dependency_injector import providers

            c = self.container
            c.peer_transport.override(
                providers.Resource(
                    _transport_resource, c.region, c.nixl_settings, c.agent_name, progress_thread=False
                )
            )
        self.tier = self.container.tier_scheduler()
        self.clock = self.container.clock()
        self.client = self.container.control_client()
        self.transport = self.container.peer_transport()
        self.fetcher = self.container.consumer_fetcher()
        self._view = self.container.region().data()
        self.data = np.frombuffer(self._view, dtype=np.uint8)

    def ask(self, address: PeerAddress, key: str) -> tuple[XferAck, float]:
        """One XferReq and its ack, busy-polled: (ack, round-trip seconds)."""
        t0 = time.perf_counter()
        self.client.send(address, XferReq(PROTOCOL_VERSION, key, FINGERPRINT, self.name))
        while not (replies := [r for r in self.client.poll() if r.address == address]):
            if time.perf_counter() - t0 > ACK_TIMEOUT_S:  # (news of other peers is dropped)
                raise TimeoutError(f"no ack for {key} within {ACK_TIMEOUT_S} s")
            os.sched_yield()
        rtt = time.perf_counter() - t0
        (reply,) = replies
        if reply.ack is None or reply.ack.status is not AckStatus.OK:
            raise RuntimeError(f"producer refused {key}: {reply}")
        return reply.ack, rtt

    def reserve(self, key: str, rows: int) -> tuple[tuple[int, int], ...]:
        reservation = self.tier.reserve_fetch(key, rows, now=self.clock.now(), lease_s=60.0)
        assert reservation is not None
        return self.tier.layout.byte_runs(reservation.entry.extents)

    def drop(self, key: str) -> None:
        """Free `key`'s blocks: evicted when READY, its reservation given up when still NOT_READY."""
        if not self.tier.evict(key):
            self.tier.fail_fetch(key, now=self.clock.now())

    def close(self) -> None:
        del self.data
        self._view.release()
        self.container.shutdown_resources()


def _summary(values: Sequence[float], scale: float) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values) * scale, 3),
        "p99": round(percentile(values, 99) * scale, 3),
    }


def _flow(consumer: Consumer, address: PeerAddress, mib: int, iterations: int) -> dict[str, Any]:
    """Instrumented request → ack → READ → done, plus a memcpy of the same bytes, per iteration."""
    key, size = item_key(mib), mib * MiB
    rows = size // consumer.tier.layout.block_size_bytes
    src = pattern(size, seed=mib)
    acks, reads, posts, copies, e2e, ack_bytes = [], [], [], [], [], 0
    from ec_connector.adapters.zmq_control.codec import encode

    for i in range(iterations + 1):  # the first one pays the connection set-up: reported apart
        local = consumer.reserve(key, rows)
        dst = [consumer.data[off : off + n] for off, n in local]
        pos = 0
        copy_s = 0.0
        for part in dst:
            copy_s += copy_seconds(part, src[pos : pos + len(part)])
            pos += len(part)
        for part in dst:
            part[:] = 0
        t0 = time.perf_counter()
        ack, rtt = consumer.ask(address, key)
        consumer.transport.add_peer(ack.agent_name, ack.agent_metadata)  # a no-op after the first
        t1 = time.perf_counter()
        handle = consumer.transport.start_read(ack.agent_name, ack.runs, local)
        posted = time.perf_counter() - t1
        state, _ = wait_read(consumer.transport, handle, bound_s=30.0, yield_cpu=True)
        t2 = time.perf_counter()
        consumer.transport.release(handle)
        consumer.client.send(address, XferDone(PROTOCOL_VERSION, key, ack.grant_id))
        t3 = time.perf_counter()
        if state is not ReadState.DONE:
            raise RuntimeError(f"READ of {key} ended {state.value}")
        if not np.array_equal(np.concatenate(dst), src):
            raise AssertionError(f"READ of {key} delivered other bytes than the producer holds")
        consumer.drop(key)
        ack_bytes = len(encode(ack))
        if i == 0:
            first = {"e2e_ms": round((t3 - t0) * 1e3, 3), "read_ms": round((t2 - t1) * 1e3, 3)}
            continue
        acks.append(rtt)
        reads.append(t2 - t1)
        posts.append(posted)
        copies.append(copy_s)
        e2e.append(t3 - t0)
    read_gibs = gibs(size, statistics.median(reads))
    copy_gibs = gibs(size, statistics.median(copies))
    return {
        "size_mib": mib,
        "runs": len(ack.runs),
        "iterations": iterations,
        "read_gibs": round(read_gibs, 3),
        "memcpy_gibs": round(copy_gibs, 3),
        "ratio": round(read_gibs / copy_gibs, 3),
        "read_ms": _summary(reads, 1e3),
        "start_read_ms": _summary(posts, 1e3),
        "ack_rtt_us": _summary(acks, 1e6),
        "ack_bytes": ack_bytes,
        "e2e_ms": _summary(e2e, 1e3),
        "first": first,
    }


def _fetcher_e2e(consumer: Consumer, params: dict, mib: int, iterations: int) -> dict[str, float]:
    """`ensure_available` → `poll` until READY, as the engine's scheduler side runs it (busy)."""
    key = item_key(mib)
    rows = mib * MiB // consumer.tier.layout.block_size_bytes
    item = [WantedItem(key, rows)]
    times = []
    for i in range(iterations):
        t0 = time.perf_counter()
        pending = not consumer.fetcher.ensure_available(f"bench-{i}", params, item)
        while pending:
            consumer.fetcher.poll()
            pending = not consumer.tier.is_ready(key)
            os.sched_yield()
            if time.perf_counter() - t0 > 30.0:
                raise TimeoutError(f"the fetcher did not make {key} ready within 30 s")
        times.append(time.perf_counter() - t0)
        if consumer.fetcher.stats.fallbacks:
            raise RuntimeError(f"the fetcher fell back for {key}: {consumer.fetcher.stats}")
        consumer.drop(key)
    return _summary(times, 1e3)


def _ack_loop(consumer: Consumer, address: PeerAddress, key: str, n: int) -> dict[str, Any]:
    rtts = []
    for _ in range(n):
        ack, rtt = consumer.ask(address, key)
        consumer.client.send(address, XferDone(PROTOCOL_VERSION, key, ack.grant_id))
        rtts.append(rtt)
    return {"n": n, "ack_rtt_us": _summary(rtts, 1e6)}


def _address(params: dict, key: str) -> PeerAddress:
    return PeerAddress(params[key]["peer_host"], params[key]["peer_port"])


def measure_mode(
    mode: str,
    pthread: bool,
    sizes: Sequence[int],
    iterations: int,
    ack_n: int,
    shm_dir: Path,
    say: Progress,
) -> dict[str, Any]:
    tag = f"{mode}-{'pt' if pthread else 'np'}"
    producer = Child(producer_main, f"bp-{tag}", mode, str(shm_dir), free_port(), tuple(sorted(set(sizes))))
    params = producer.start()["params"]
    consumer = Consumer(f"bc-{tag}", mode, shm_dir, (max(sizes) + 1) * MiB, progress_thread=pthread)
    label = f"{mode}, consumer progress thread {'on' if pthread else 'off'}"
    try:
        out: dict[str, Any] = {"mode": mode, "progress_thread": pthread, "flow": [], "fetcher_e2e_ms": {}}
        for mib in sizes:
            row = _flow(consumer, _address(params, item_key(mib)), mib, iterations)
            out["flow"].append(row)
            say(
                f"[{label}] {mib:>2} MiB: READ {row['read_gibs']:.2f} GiB/s, memcpy {row['memcpy_gibs']:.2f}"
                f" GiB/s, ratio {row['ratio']:.2f}; ack p50 {row['ack_rtt_us']['p50']:.0f} us"
            )
        for mib in sizes:
            out["fetcher_e2e_ms"][str(mib)] = _fetcher_e2e(consumer, params, mib, iterations)
        smallest = item_key(min(sizes))
        out["ack_loop"] = _ack_loop(consumer, _address(params, smallest), smallest, ack_n)
        out["consumer_stats"] = consumer.fetcher.stats.as_dict()
    finally:
        consumer.close()
        producer.stop()
    return out


def _death_trial(
    mode: str, case: str, shm_dir: Path, consumer: Consumer, trial: int, bound_s: float
) -> dict[str, Any]:
    """One producer, SIGKILLed while a READ from it is in flight (`mid_read`) or after its ack and
    before the READ is posted (`before_read`); what the READ reports and how soon after the kill."""
    mib = max(SIZES_MIB)
    key = item_key(mib)
    producer = Child(producer_main, f"bd-{mode}-{case}-{trial}", mode, str(shm_dir), free_port(), (mib,))
    params = producer.start()["params"]
    try:
        ack, _ = consumer.ask(_address(params, key), key)
        consumer.transport.add_peer(ack.agent_name, ack.agent_metadata)
        local = consumer.reserve(key, mib * MiB // consumer.tier.layout.block_size_bytes)
        handle = consumer.transport.start_read(ack.agent_name, ack.runs, local)  # connects, warms up
        state, _ = wait_read(consumer.transport, handle, bound_s=30.0)
        consumer.transport.release(handle)
        assert state is ReadState.DONE, state
        if case == "before_read":
            producer.signal(signal.SIGKILL)
            producer.proc.join(10)
            t0 = time.perf_counter()
            try:
                handle = consumer.transport.start_read(ack.agent_name, ack.runs, local)
            except ConnectionError:
                return {"outcome": "refused", "ms": round((time.perf_counter() - t0) * 1e3, 2)}
            state, seconds = wait_read(consumer.transport, handle, bound_s=bound_s, yield_cpu=True)
            consumer.transport.release(handle)
            return {"outcome": state.value, "ms": round((time.perf_counter() - t0) * 1e3, 2)}
        t0 = time.perf_counter()
        handle = consumer.transport.start_read(
            ack.agent_name, list(ack.runs) * DEATH_REPEAT, list(local) * DEATH_REPEAT
        )
        posted = time.perf_counter() - t0
        time.sleep(0.02)
        if consumer.transport.read_state(handle) is not ReadState.PENDING:
            outcome, ms = "completed_inside_start_read", posted * 1e3
        else:
            producer.signal(signal.SIGKILL)
            state, seconds = wait_read(consumer.transport, handle, bound_s=bound_s, yield_cpu=True)
            outcome, ms = state.value, seconds * 1e3
        consumer.transport.release(handle)
        return {"outcome": outcome, "ms": round(ms, 2)}
    finally:
        producer.kill()
        with contextlib.suppress(Exception):
            consumer.drop(key)


def producer_death(
    mode: str, transport: str, case: str, trials: int, shm_dir: Path, say: Progress, bound_s: float = 5.0
) -> dict[str, Any]:
    """Producers SIGKILLed around a READ (see `_death_trial`): FAILED how fast, refused, or stuck."""
    with ucx_tls("tcp,self" if transport == "tcp" else None):
        consumer = Consumer(f"bk-{mode}-{transport}-{case}", mode, shm_dir, (max(SIZES_MIB) + 1) * MiB)
        try:
            results = [_death_trial(mode, case, shm_dir, consumer, t, bound_s) for t in range(trials)]
        finally:
            consumer.close()
    outcomes: dict[str, list[float]] = {}
    for r in results:
        outcomes.setdefault(r["outcome"], []).append(r["ms"])
    out = {"mode": mode, "transport": transport, "case": case, "trials": trials, "bound_s": bound_s}
    out["outcomes_ms"] = outcomes
    say(f"[{mode}, {transport}] producer killed {case.replace('_', ' ')}: {describe_outcomes(out)}")
    return out


def hung_producer(mode: str, shm_dir: Path, say: Progress, bound_s: float = 2.0) -> dict[str, Any]:
    """The producer acks, then stops (SIGSTOP) before the consumer's first READ from it."""
    mib = min(SIZES_MIB)
    key = item_key(mib)
    producer = Child(producer_main, f"bh-{mode}", mode, str(shm_dir), free_port(), (mib,))
    params = producer.start()["params"]
    consumer = Consumer(f"bhc-{mode}", mode, shm_dir, (mib + 1) * MiB)
    try:
        ack, _ = consumer.ask(_address(params, key), key)
        producer.signal(signal.SIGSTOP)
        consumer.transport.add_peer(ack.agent_name, ack.agent_metadata)
        local = consumer.reserve(key, mib * MiB // consumer.tier.layout.block_size_bytes)
        handle = consumer.transport.start_read(ack.agent_name, ack.runs, local)
        state, seconds = wait_read(consumer.transport, handle, bound_s=bound_s)
        consumer.transport.release(handle)
    finally:
        producer.kill()
        consumer.close()
    out = {"mode": mode, "state": state.value, "ms": round(seconds * 1e3, 2), "bound_s": bound_s}
    say(f"[{mode}] READ from a stopped producer: {state.value} after {seconds * 1e3:.1f} ms")
    return out


def run(
    sizes: Sequence[int] = SIZES_MIB,
    modes: Sequence[str] = MODES,
    iterations: int = 20,
    progress: Progress | None = None,
    *,
    ack_n: int = 200,
    death_trials: int = 6,
    death_cases: Sequence[tuple[str, str]] = DEATH_CASES,
    consumer_progress_thread: Sequence[bool] = (True, False),
) -> dict[str, Any]:
    """Every figure of the benchmark as a dict (see the module docstring for what each means)."""
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {MODES}")
    if not sizes or any(not isinstance(m, int) or m <= 0 for m in sizes):
        raise ValueError(f"sizes must be positive whole MiB, got {sizes!r}")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    say = progress or (lambda _line: None)
    _quiet_logs()
    from importlib.metadata import PackageNotFoundError, version

    try:
        nixl_version = version("nixl")
    except PackageNotFoundError:
        nixl_version = "?"
    result: dict[str, Any] = {
        "host": {
            "cpus": os.cpu_count(),
            "loadavg_at_start": os.getloadavg()[0],
            "ucx_tls": os.environ.get("UCX_TLS", "(unset)"),
            "nixl": nixl_version,
            "python": sys.version.split()[0],
        },
        "config": {
            "sizes_mib": list(sizes),
            "modes": list(modes),
            "iterations": iterations,
            "row_bytes": HIDDEN_DIM * 2,
            "ack_loop_n": ack_n,
            "death_trials": death_trials,
            "death_cases": [list(c) for c in death_cases],
            "consumer_progress_thread": list(consumer_progress_thread),
        },
        "modes": [],
        "producer_death": [],
        "hung_producer": [],
    }
    with scratch_shm_dir("ec_bench_p2p") as shm_dir:
        for pthread in consumer_progress_thread:
            for mode in modes:
                result["modes"].append(measure_mode(mode, pthread, sizes, iterations, ack_n, shm_dir, say))
        for mode in modes:
            for transport, case in death_cases if death_trials else ():
                # the cma cases end the same way every time: a third of the trials is enough
                trials = death_trials if transport == "tcp" else max(1, death_trials // 3)
                result["producer_death"].append(producer_death(mode, transport, case, trials, shm_dir, say))
            result["hung_producer"].append(hung_producer(mode, shm_dir, say))
    return result


def presets(quick: bool) -> dict[str, Any]:
    """`run`'s keyword arguments for a full run or a --quick one (also what `ec-connector bench p2p` uses)."""
    return {
        "iterations": 5 if quick else 20,
        "ack_n": 50 if quick else 200,
        "death_trials": 2 if quick else 6,
        "death_cases": DEATH_CASES[:1] if quick else DEATH_CASES,
        "consumer_progress_thread": (True,) if quick else (True, False),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer iterations and death trials (~1.5 min)")
    ap.add_argument("--json", type=Path, help="also write every figure to this file as JSON")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--sizes", nargs="+", type=int, default=list(SIZES_MIB), help="entry sizes in MiB")
    ap.add_argument("--iterations", type=int, help="timed items per size and mode (default 20, quick 5)")
    ap.add_argument(
        "--death-trials",
        type=int,
        help="producers killed mid-READ over TCP per mode (default 6, quick 2; 0: none)",
    )
    args = ap.parse_args()
    options = presets(args.quick)
    if args.iterations:
        options["iterations"] = args.iterations
    if args.death_trials is not None:
        options["death_trials"] = args.death_trials
    result = run(args.sizes, args.modes, progress=lambda line: print(line, flush=True), **options)
    print_report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
