"""How much a same-host NIXL READ gains when its descriptors are posted by several UCX threads.

Evidence for issue #8 (P2P time per 9 MiB item): the bytes of one READ move inside the post on
one host (UCX's cma lane: a process_vm_readv copy per descriptor), so one descriptor is one
single-threaded copy. NIXL's UCX backend with `num_threads` N > 0 runs a pool of N posting threads;
with `split_batch_size` 1 it spreads a READ of several descriptors over them. This measures READs
of `--mib` MiB cut into K equal descriptors, for each (threads, K), alternating configurations in
rounds, bytes checked on the first READ of each configuration per round.

    .venv-vllm/bin/python bench/nixl_parallel_read.py --mib 9 32

Only numpy and nixl (no ec_connector, torch or ZMQ): a spawned producer registers a 64 MiB
pattern, this process creates one consumer agent per thread count, all with UCX error mode
`peer` and NIXL's progress thread, as our consumer's agent. Time = `initialize_xfer` + `transfer`
+ `check_xfer_state` until DONE, on the calling thread.

Why the product gets the same effect from several agents instead (`LanedPeerTransport`,
`nixl_read_lanes`): with NIXL 1.5.1, `num_threads` > 1 and `split_batch_size` 1, a consumer whose
producer was killed mid-READ aborted later, when its agent was destroyed (UCX `arbiter.c`
assertion `ucs_arbiter_group_is_empty`), in `tests/contract/test_peer_contract.py`'s
killed-producer case (3 runs of 4). docs/benchmarks.md, "One READ on several threads".
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np

AREA = 64 << 20


def _pattern() -> np.ndarray:
    return (np.arange(AREA, dtype=np.uint64) * 2654435761 % 251).astype(np.uint8)


def _producer(conn) -> None:  # noqa: ANN001
    from nixl._api import nixl_agent, nixl_agent_config

    agent = nixl_agent("npr-prod", nixl_agent_config(enable_prog_thread=True, backends=[]))
    agent.create_backend("UCX", {"ucx_error_handling_mode": "peer"})
    buf = _pattern()
    agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM", backends=["UCX"])
    conn.send((agent.get_agent_metadata(), buf.ctypes.data))
    conn.recv()  # until the consumer is done


def _descs(base: int, off: int, size: int, parts: int) -> list[tuple[int, int, int]]:
    piece = -(-size // parts)
    return [(base + off + i * piece, min(piece, size - i * piece), 0) for i in range(parts)]


def run(sizes_mib: list[int], threads: list[int], parts: list[int], rounds: int, reps: int) -> dict:
    from nixl._api import nixl_agent, nixl_agent_config

    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_producer, args=(theirs,), daemon=True)
    proc.start()
    meta, remote_base = ours.recv()
    expect, dst = _pattern(), np.zeros(AREA, dtype=np.uint8)
    agents = {}
    for n in threads:
        agent = nixl_agent(f"npr-cons-{n}", nixl_agent_config(enable_prog_thread=True, backends=[]))
        params = {"ucx_error_handling_mode": "peer", "num_threads": str(n)}
        if n > 1:
            params["split_batch_size"] = "1"
        agent.create_backend("UCX", params)
        agent.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM", backends=["UCX"])
        agents[n] = (agent, agent.add_remote_agent(meta))
    times: dict[tuple[int, int, int], list[float]] = {}
    try:
        for rnd in range(rounds):
            for mib in sizes_mib:
                size = mib << 20
                for n in threads:
                    for k in parts:
                        agent, peer = agents[n]
                        out = times.setdefault((mib, n, k), [])
                        for rep in range(reps):
                            off = ((rnd * reps + rep) * (size + 4096)) % (AREA - size)
                            off -= off % 4096  # a fresh stretch per READ, as new items are
                            local = agent.get_xfer_descs(_descs(dst.ctypes.data, off, size, k), "DRAM")
                            remote = agent.get_xfer_descs(_descs(remote_base, off, size, k), "DRAM")
                            t0 = time.perf_counter()
                            xfer = agent.initialize_xfer("READ", local, remote, peer, b"", backends=["UCX"])
                            state = agent.transfer(xfer)
                            while state not in ("DONE", "ERR"):
                                state = agent.check_xfer_state(xfer)
                            out.append(time.perf_counter() - t0)
                            agent.release_xfer_handle(xfer)
                            if state != "DONE":
                                raise RuntimeError(f"READ {mib} MiB threads={n} descs={k} ended {state}")
                            got, want = dst[off : off + size], expect[off : off + size]
                            if rep == 0 and not np.array_equal(got, want):
                                raise AssertionError(f"bytes differ: {mib} MiB threads={n} descs={k}")
                            dst[off : off + size] = 0
    finally:
        ours.send("stop")
        proc.join(10)
    return {"cpus": os.cpu_count(), "load_avg": os.getloadavg()[0], "times": times}


def render(res: dict) -> str:
    lines = [f"{res['cpus']} CPUs, load average {res['load_avg']:.2f} after; ms (q1-q3), GiB/s at the median"]
    base: dict[int, float] = {}
    for (mib, n, k), t in sorted(res["times"].items()):
        med, (q1, _, q3) = statistics.median(t), statistics.quantiles(t, n=4)
        base.setdefault(mib, med)
        lines.append(
            f"{mib:3d} MiB  threads {n:2d}  descriptors {k:2d}: {med * 1e3:7.3f} ms ({q1 * 1e3:.3f}-"
            f"{q3 * 1e3:.3f})  {mib / 1024 / med:6.2f} GiB/s  {base[mib] / med:5.2f}x the first row"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, nargs="+", default=[9, 32])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--descriptors", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=8)
    args = ap.parse_args(argv)
    if max(args.mib) > 48 or min(args.mib) < 1:
        ap.error("--mib must be 1-48 (the producer's area is 64 MiB)")
    print(render(run(args.mib, args.threads, args.descriptors, args.rounds, args.reps)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
