"""The bare NIXL READ, ours against vLLM's: `NixlPeerTransport` vs vLLM 0.32's `NixlDataTransport`.

No ZMQ, no fetcher, no cache: only the data plane of each connector, in one pair of processes on
127.0.0.1 (issue #8: our READ was 1.3-1.4x vLLM's in bench/compare_p2p.py on the same UCX lane).

    .venv-vllm/bin/python bench/compare_nixl_read.py                      # 9 MiB, 4 rounds x 15
    .venv-vllm/bin/python bench/compare_nixl_read.py --mib 1 9 32 --kinds ours inline vllm

A spawned producer holds a populated /dev/shm mapping filled with a seeded pattern; this process
(the consumer) holds its own. Per phase both processes create the side under test on those same
mappings, connect, warm up, time `--reps` READs of the first `--mib` MiB (offset 0 to offset 0),
check the bytes once, and destroy their agents; phases alternate kinds within each round, so every
kind sees the same machine. Time = post until the state says DONE, the caller polling in a tight
loop (as both benchmarks' consumers do). Kinds:

- `ours`: `NixlPeerTransport` on both sides (one descriptor; the READ is posted by its poster
  thread; `start_read` then `read_state` until DONE);
- `vllm`: `NixlDataTransport` on both sides, as vLLM creates it (its agent config, a prepped
  descriptor list per side with one 7 KiB descriptor per block, `make_prepped_xfer` with a
  notification, `check_xfer_state` until DONE);
- `inline`: a bare NIXL agent set up as ours (UCX backend, error mode `peer`, one worker thread,
  progress thread) reading from our producer with one descriptor, `initialize_xfer` + `transfer`
  on the calling thread: what ours costs without a poster thread.

Every agent runs its NIXL progress thread (both connectors' default), so the two processes keep
two threads spinning: on a 2-core host the load average reads ~2 during a run by itself.
"""

from __future__ import annotations

import argparse
import gc
import mmap
import multiprocessing as mp
import os
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.vllm_baseline import BaselineUnavailable, load  # noqa: E402

MiB = 1 << 20
ROW = 7168  # bf16, hidden 3584: the rows of bench/compare_p2p.py
PRODUCER_BYTES = 100 * MiB // ROW * ROW
CONSUMER_BYTES = 68 * MiB // ROW * ROW
KINDS = ("ours", "inline", "vllm")
EC = "vllm.distributed.ec_transfer.ec_connector.cpu"


def mapping(path: str, size: int) -> tuple[mmap.mmap, np.ndarray]:
    """A populated MAP_SHARED mapping of a /dev/shm file (as both connectors map their regions)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    finally:
        os.close(fd)
    area = np.frombuffer(mm, dtype=np.uint8)
    area[::4096] = 0  # every page present in this process
    return mm, area


def seeded(nbytes: int) -> np.ndarray:
    return np.random.default_rng(7).integers(0, 256, nbytes, dtype=np.uint8)


def our_side(name: str, address: int, size: int):
    from ec_connector.adapters.nixl_data import NixlPeerTransport

    region = types.SimpleNamespace(
        layout=types.SimpleNamespace(data_bytes=size), data_address=lambda: address
    )
    return NixlPeerTransport(region, agent_name=name)


def vllm_side(name: str, address: int, size: int):
    cls = load(f"{EC}.data.nixl").NixlDataTransport
    blocks = size // ROW
    return cls(
        agent_name=name,
        base_ptr=address,
        num_blocks=blocks,
        block_size_bytes=ROW,
        total_size_bytes=blocks * ROW,
    )


def producer_main(path: str, conn) -> None:  # the spawned producer
    mm, area = mapping(path, PRODUCER_BYTES)
    area[:] = seeded(PRODUCER_BYTES)
    side: Any = None  # our NixlPeerTransport or vLLM's NixlDataTransport, per "make"
    try:
        while (cmd := conn.recv())[0] != "stop":
            if cmd[0] == "make":
                _, kind, name = cmd
                if kind == "vllm":
                    side = vllm_side(name, area.ctypes.data, PRODUCER_BYTES)
                    conn.send((side.get_agent_metadata(), side.get_mem_descriptor()))
                else:
                    side = our_side(name, area.ctypes.data, PRODUCER_BYTES)
                    conn.send((side.agent_metadata(), None))
            elif cmd[0] == "drop":
                if kind == "vllm":
                    side.deregister()
                else:
                    side.close()
                side = None
                gc.collect()
                conn.send("dropped")
    finally:
        del area
        mm.close()


def _busy_until_done(check, handle) -> None:
    while (state := check(handle)) != "DONE":
        if state != "PROC":
            raise RuntimeError(f"READ ended {state}")


def reads_vllm(name, peer_md, peer_blocks, address, nbytes, n):
    side = vllm_side(name, address, CONSUMER_BYTES)
    try:
        agent = side.add_remote_peer(peer_md, peer_blocks)
        blocks = list(range(nbytes // ROW))
        for i in range(n):
            t0 = time.perf_counter()
            handle = side.post_read(blocks, agent, blocks, f"bench:{i}".encode())
            _busy_until_done(side.check_xfer_state, handle)
            yield time.perf_counter() - t0
            side.release_xfer_handle(handle)
    finally:
        side.deregister()


def reads_ours(name, peer, peer_md, address, nbytes, n):
    from ec_connector.ports.peer import ReadState

    side = our_side(name, address, CONSUMER_BYTES)
    try:
        side.add_peer(peer, peer_md)
        for _ in range(n):
            t0 = time.perf_counter()
            handle = side.start_read(peer, [(0, nbytes)], [(0, nbytes)])
            while (state := side.read_state(handle)) is ReadState.PENDING:
                pass
            if state is not ReadState.DONE:
                raise RuntimeError(f"READ ended {state}")
            yield time.perf_counter() - t0
            side.release(handle)
    finally:
        side.close()


def reads_inline(name, peer, peer_md, address, nbytes, n):
    from ec_connector.adapters.nixl_data import wire
    from ec_connector.adapters.nixl_data.errors import load_nixl

    api = load_nixl()
    info = wire.decode(peer_md, peer=peer)
    agent = api.nixl_agent(name, api.nixl_agent_config(enable_prog_thread=True, backends=[]))
    agent.create_backend("UCX", {"ucx_error_handling_mode": "peer", "num_threads": "1"})
    reg = agent.register_memory([(address, CONSUMER_BYTES, 0, "")], "DRAM", backends=["UCX"])
    try:
        remote = agent.add_remote_agent(info.nixl_metadata)
        for _ in range(n):
            t0 = time.perf_counter()
            handle = agent.initialize_xfer(
                "READ",
                agent.get_xfer_descs([(address, nbytes, 0)], "DRAM"),
                agent.get_xfer_descs([(info.base_address, nbytes, 0)], "DRAM"),
                remote,
                backends=["UCX"],
            )
            agent.transfer(handle)
            _busy_until_done(agent.check_xfer_state, handle)
            yield time.perf_counter() - t0
            agent.release_xfer_handle(handle)
        agent.remove_remote_agent(remote)
    finally:
        agent.deregister_memory(reg, backends=["UCX"])


def phase(
    kind: str, tag: str, conn, area: np.ndarray, expected: np.ndarray, nbytes: int, args
) -> list[float]:
    """One kind's agents on both sides: warm-up, `reps` timed READs, one check of the bytes."""
    name, peer = f"cons-{tag}", f"prod-{tag}"
    conn.send(("make", "vllm" if kind == "vllm" else "ours", peer))
    peer_md, peer_blocks = conn.recv()
    n = args.warmup + args.reps
    try:
        if kind == "vllm":
            times = list(reads_vllm(name, peer_md, peer_blocks, area.ctypes.data, nbytes, n))
        elif kind == "ours":
            times = list(reads_ours(name, peer, peer_md, area.ctypes.data, nbytes, n))
        else:
            times = list(reads_inline(name, peer, peer_md, area.ctypes.data, nbytes, n))
        if not np.array_equal(area[:nbytes], expected[:nbytes]):
            raise AssertionError(f"{kind}: the bytes read differ from the producer's")
        area[:nbytes] = 0  # stale bytes cannot pass the next phase's check
    finally:
        gc.collect()
        conn.send(("drop",))
        conn.recv()
    return times[args.warmup :]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, nargs="+", default=[9], help="READ sizes in MiB (default 9)")
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=["ours", "vllm"])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    if "vllm" in args.kinds:
        try:
            load(f"{EC}.data.nixl")
        except BaselineUnavailable as err:
            print(f"skipped: {err}")
            return 0
    tag = f"{os.getpid()}"
    paths = (f"/dev/shm/ec_nixl_read_p_{tag}", f"/dev/shm/ec_nixl_read_c_{tag}")
    ctx = mp.get_context("spawn")
    conn, theirs = ctx.Pipe()
    producer = ctx.Process(target=producer_main, args=(paths[0], theirs), daemon=True)
    load_before = os.getloadavg()[0]
    producer.start()
    mm, area = mapping(paths[1], CONSUMER_BYTES)
    expected = seeded(PRODUCER_BYTES)
    times: dict[tuple[int, str], list[float]] = {}
    try:
        for mib in args.mib:
            nbytes = mib * MiB // ROW * ROW
            for r in range(args.rounds):
                for kind in args.kinds:
                    ts = phase(kind, f"{tag}-{mib}-{r}-{kind}", conn, area, expected, nbytes, args)
                    times.setdefault((mib, kind), []).extend(ts)
    finally:
        conn.send(("stop",))
        producer.join(30)
        del area
        mm.close()
        for p in paths:
            Path(p).unlink(missing_ok=True)
    print(
        f"{args.rounds} rounds x {args.reps} READs per kind and size, alternating; load average "
        f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after; ms (q1-q3); GiB/s at the median"
    )
    base = "vllm" if "vllm" in args.kinds else args.kinds[-1]
    for mib in args.mib:
        ref = statistics.median(times[(mib, base)])
        for kind in args.kinds:
            ts = times[(mib, kind)]
            med, (q1, _, q3) = statistics.median(ts), statistics.quantiles(ts, n=4)
            print(
                f"{mib:3d} MiB {kind:7s} {med * 1e3:7.2f} ms ({q1 * 1e3:6.2f}-{q3 * 1e3:6.2f})  "
                f"{mib * MiB / med / 2**30:5.2f} GiB/s  {med / ref:5.2f}x {base}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
