"""The save launcher (launcher.c): copy-engine saves handed to the CUDA driver by a native thread.

`CudaEngine.save` plans a batch, records a fence on the caller's stream and submits the batch's
copies here; the launcher's thread (no Python, no GIL) queues the fence wait, the start event, the
copies and the end event on the job's copy stream. The step thread no longer spends the driver's
~0.7-1.5 µs per copy inside the launch. Loads are not launched here: the caller's stream must wait
on a load's end event before `load` returns, so the event must be recorded by then.

The driver's work is moved, not removed. From the legacy default stream, which is ordered with every
other blocking stream, the driver serializes it with the step thread's own calls: on the H200
(docs/benchmarks.md), 30 kernel launches made right after a flush took 47-78 µs
longer, about what the launcher had taken off the flush. From a stream of the caller's own, as
vLLM's model runner calls on CUDA, they took no longer (-29 to +13 µs), and a step of a 32-entry
load, its save and flush and those launches took 0.81-1.00x the host time of the step thread's own
call (once 1.04x in 34 cases). The container turns it on for every role (the roles
that save: `ec_producer` and `ec_both`).

One thread submits (the copier's caller, under `TierWorker`'s lock); `done` says how many jobs the
launcher has queued on their streams, and raises once one has failed: the CUDA call that failed is
named, every later job is skipped, and the GPU context may be unusable, as when the step thread's
own call fails.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np

from ec_connector.adapters.torch_copy.cudart import EntryPoints
from ec_connector.adapters.torch_copy.native import build
from ec_connector.domain.errors import ECConnectorError

SOURCE = Path(__file__).with_name("launcher.c")
SLOTS = 256  # jobs queued and not yet handled before `submit` waits for room
_vp, _i64 = ctypes.c_void_p, ctypes.c_int64


class SaveLauncher:
    """A native thread that queues planned copy-engine batches on their streams, in order."""

    def __init__(self, entry: EntryPoints, device: int, *, slots: int = SLOTS) -> None:
        lib = library()
        handle = lib.ec_launcher_new(
            slots,
            device,
            entry.set_device,
            entry.wait,
            entry.record,
            entry.memcpy,
            entry.batch or None,
            int(entry.batch_has_fail_index),
            entry.attrs,
            entry.attr_index,
            entry.batch_max,
        )
        if not handle:
            raise ECConnectorError(
                f"the save launcher could not start: {slots} slots and batches of {entry.batch_max} "
                "copies must each be at least 1, else the process is out of memory or threads"
            )
        self._handle: int | None = handle
        self._lib = lib
        self._submit = lib.ec_launcher_submit
        self._done = lib.ec_launcher_done
        self._error = np.zeros(3, dtype=np.int64)

    def submit(
        self, stream: int, fence: int, start: int, end: int, dst: int, src: int, size: int, count: int
    ) -> int:
        """Queue a job: wait for `fence` on `stream`, record `start`, copy `count` (dst, src, size)
        from the three int64 columns at `dst`, `src`, `size` (read before this returns), record
        `end`. Returns the job's number (0, 1, ...)."""
        job = int(self._submit(self._live(), stream, fence, start, end, dst, src, size, count))
        if job < 0:
            raise ECConnectorError("the save launcher is " + ("out of memory" if job == -1 else "closed"))
        return job

    def done(self) -> int:
        """How many jobs are queued on their streams (jobs 0..done-1); raises once one has failed."""
        done = int(self._done(self._live()))
        if done < 0:
            self._raise()
        return done

    def drain(self) -> None:
        """Wait until every submitted job has been handled (queued, or skipped after a failure)."""
        self._lib.ec_launcher_drain(self._live())

    def failure(self) -> tuple[int, str] | None:
        """The first failed job's number and what failed, or None."""
        self._lib.ec_launcher_error(self._live(), self._error.ctypes.data)
        job, call, code = self._error.tolist()
        if job < 0:
            return None
        return (
            job,
            f"{build.QUEUE_CALLS.get(call, f'call {call}')} of save job {job} failed with CUDA error {code}",
        )

    def close(self) -> None:
        """Handle what is queued, stop the thread, free the jobs; idempotent."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            self._lib.ec_launcher_free(handle)

    def _live(self) -> int:
        if self._handle is None:
            raise ECConnectorError("the save launcher is closed")
        return self._handle

    def _raise(self) -> None:
        failed = self.failure()
        what = failed[1] if failed else "a save job failed"
        raise ECConnectorError(f"{what}; the GPU context may be unusable")


_library: ctypes.CDLL | None = None
_lock = threading.Lock()


def library() -> ctypes.CDLL:
    """The compiled launcher, built on first use (once per source and compiler, then cached).

    `submit` and `done` keep the GIL (short, never wait on the device); `drain` and `free` may wait
    for the thread and release it."""
    global _library
    with _lock:
        if _library is None:
            path = str(build.build(SOURCE, "the save launcher"))
            held, free = ctypes.PyDLL(path), ctypes.CDLL(path)
            held.ec_launcher_new.argtypes = [_i64, _i64, _vp, _vp, _vp, _vp, _vp, _i64, _vp, _vp, _i64]
            held.ec_launcher_new.restype = _vp
            held.ec_launcher_submit.argtypes = [_vp, _i64, _i64, _i64, _i64, _vp, _vp, _vp, _i64]
            held.ec_launcher_submit.restype = _i64
            held.ec_launcher_done.argtypes = [_vp]
            held.ec_launcher_done.restype = _i64
            held.ec_launcher_error.argtypes = [_vp, _vp]
            held.ec_launcher_error.restype = None
            for name in ("ec_launcher_drain", "ec_launcher_free"):
                fn = getattr(free, name)
                fn.argtypes = [_vp]
                fn.restype = None
                setattr(held, name, fn)
            _library = held
        return _library
