"""Smoke test of the carried NIXL: two processes, UCX backend, one DRAM READ of 8 MiB, bytes checked.

Prints the plugins NIXL finds, the UCX transports in use (if UCX_LOG_LEVEL=info) and, with --maps,
every shared object the reading process has mapped (to check that only the kit's files load).
Uses only numpy and nixl (no torch, no ec_connector).
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time

import numpy as np

N = 8 << 20


def producer(conn) -> None:
    from nixl._api import nixl_agent, nixl_agent_config

    agent = nixl_agent("probe-prod", nixl_agent_config(enable_prog_thread=True, backends=["UCX"]))
    buf = np.arange(N, dtype=np.uint64).astype(np.uint8)
    reg = agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM", backends=["UCX"])
    conn.send((agent.get_agent_metadata(), buf.ctypes.data))
    conn.recv()  # until the reader is done
    agent.deregister_memory(reg, backends=["UCX"])


def main() -> int:
    from nixl._api import nixl_agent, nixl_agent_config

    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=producer, args=(theirs,), daemon=True)
    proc.start()
    agent = nixl_agent("probe-cons", nixl_agent_config(enable_prog_thread=True, backends=["UCX"]))
    print("plugins:", agent.get_plugin_list(), flush=True)
    dst = np.zeros(N, dtype=np.uint8)
    reg = agent.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM", backends=["UCX"])
    meta, remote_addr = ours.recv()
    peer = agent.add_remote_agent(meta)
    t0 = time.perf_counter()
    xfer = agent.initialize_xfer(
        "READ",
        agent.get_xfer_descs([(dst.ctypes.data, N, 0)], "DRAM"),
        agent.get_xfer_descs([(remote_addr, N, 0)], "DRAM"),
        peer,
        b"probe",
        backends=["UCX"],
    )
    state = agent.transfer(xfer)
    while state not in ("DONE", "ERR"):
        state = agent.check_xfer_state(xfer)
        if time.perf_counter() - t0 > 30:
            state = "TIMEOUT"
            break
    dt = time.perf_counter() - t0
    ok = state == "DONE" and np.array_equal(dst, np.arange(N, dtype=np.uint64).astype(np.uint8))
    print(f"READ {N >> 20} MiB: state={state} bytes_ok={ok} {dt * 1e3:.1f} ms (first READ, incl. connect)")
    if "--maps" in sys.argv:
        with open("/proc/self/maps") as f:
            libs = sorted({line.split()[-1] for line in f if ".so" in line.split()[-1]})
        print("mapped shared objects:")
        for lib in libs:
            print("  ", lib)
    agent.release_xfer_handle(xfer)
    agent.deregister_memory(reg, backends=["UCX"])
    ours.send("stop")
    proc.join(10)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
