"""Helpers the NIXL/P2P benchmarks share: scratch /dev/shm folders, spawned peer processes,
seeded byte patterns, READ polling and plain-copy timing.

The research benches in the checkout's bench/ import it through bench/common.py, which re-exports it.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from ec_connector.ports.peer import ReadState

MiB = 1 << 20


def pattern(nbytes: int, seed: int = 7) -> np.ndarray:
    """`nbytes` seeded random bytes: what a producer writes and a reader checks against."""
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


@contextlib.contextmanager
def scratch_shm_dir(prefix: str = "ec_bench") -> Iterator[Path]:
    """A private folder under /dev/shm for the benchmark's regions, removed afterwards."""
    path = Path("/dev/shm") / f"{prefix}_{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Child:
    """A spawned process running `target(*args, conn)`, talking to us over a pipe.

    The child's first message (`hello`, awaited by `start`) is typically what a peer needs to reach
    it; `stop` sends "stop" and joins; `kill` SIGKILLs it. The spawned interpreter inherits
    os.environ as it is when `start` runs (UCX_* variables included).
    """

    def __init__(self, target: Callable[..., None], *args: Any, start_timeout_s: float = 120.0) -> None:
        ctx = mp.get_context("spawn")
        self._conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(*args, theirs), daemon=True)
        self._start_timeout_s = start_timeout_s
        self.hello: Any = None

    def start(self) -> Any:
        self.proc.start()
        if not self._conn.poll(self._start_timeout_s):
            self.kill()
            raise TimeoutError(f"child {self.proc.pid} did not start within {self._start_timeout_s} s")
        self.hello = self._conn.recv()
        return self.hello

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def kill(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)  # a stopped child must run to die cleanly
                os.kill(self.pid, signal.SIGKILL)
        self.proc.join(10)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send("stop")
            self.proc.join(timeout_s)
        if self.proc.is_alive():
            self.kill()
        self._conn.close()


def wait_for_stop(conn: Connection) -> None:
    """In a child: block until the parent says stop (or goes away)."""
    with contextlib.suppress(EOFError):
        conn.recv()


def wait_read(
    transport: Any, handle: int, *, bound_s: float, yield_cpu: bool = False
) -> tuple[ReadState, float]:
    """Poll `read_state` until the READ leaves PENDING or `bound_s` passes: (state, seconds).

    Busy polling; `yield_cpu` gives the core away between polls (sched_yield), which matters
    when the polling thread competes with spinning progress threads for few cores.
    """
    t0 = time.perf_counter()
    while (state := transport.read_state(handle)) is ReadState.PENDING:
        if time.perf_counter() - t0 > bound_s:
            break
        if yield_cpu:
            os.sched_yield()
    return state, time.perf_counter() - t0


def copy_seconds(dst: np.ndarray, src: np.ndarray) -> float:
    """One plain in-process copy (memcpy through numpy) of `src` into `dst`."""
    t0 = time.perf_counter()
    np.copyto(dst, src)
    return time.perf_counter() - t0


def local_copy_gibs(payload: int, reps: int) -> float:
    """GiB/s of a plain numpy copy of `payload` bytes between two fresh arrays (median of reps)."""
    a = np.ones(payload, dtype=np.uint8)
    b = np.zeros(payload, dtype=np.uint8)
    times = [copy_seconds(b, a) for _ in range(reps + 1)]
    return payload / statistics.median(times[1:]) / 2**30


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank; with fewer than 100 samples p99 is the maximum."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no samples")
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def gibs(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 2**30
