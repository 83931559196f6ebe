"""The save launcher's native thread (launcher.c) driven through entry points of our own.

The launcher calls whatever C entry points it is given; here they are ctypes callbacks that log
each call (run on the launcher's own thread), so the order of a job's stream operations, the copy
columns, the cut into calls of `batch_max`, failures and shutdown are checked without a GPU. The
CUDA contract and worker suites run the same launcher against the real runtime on the GPU machine.
"""

from __future__ import annotations

import ctypes
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ec_connector.adapters.torch_copy.cudart import EntryPoints
from ec_connector.adapters.torch_copy.native import build as native
from ec_connector.adapters.torch_copy.native.launcher import SaveLauncher
from ec_connector.domain.errors import ECConnectorError

from ..native_marks import NEEDS_COMPILER
from .fake_runtime import ATTR_INDEX, ATTRS, Runtime

pytestmark = NEEDS_COMPILER
_vp = ctypes.c_void_p


class Job:
    """One job's columns, kept in numpy arrays the test can overwrite after submitting."""

    def __init__(self, count: int, base: int) -> None:
        self.dst = np.arange(base, base + count, dtype=np.int64) * 16
        self.src = self.dst + 1
        self.size = np.full(count, base, dtype=np.int64)

    def submit(self, launcher: SaveLauncher, stream: int, events: tuple[int, int, int]) -> int:
        fence, start, end = events
        addresses = (self.dst.ctypes.data, self.src.ctypes.data, self.size.ctypes.data)
        return launcher.submit(stream, fence, start, end, *addresses, len(self.dst))

    def copies(self) -> list[tuple[int, int, int]]:
        return list(zip(self.dst.tolist(), self.src.tolist(), self.size.tolist(), strict=True))


@pytest.fixture
def runtime() -> Runtime:
    return Runtime()


@pytest.fixture
def launcher(runtime: Runtime) -> Iterator[SaveLauncher]:
    out = SaveLauncher(runtime.entry, device=3)
    yield out
    out.close()


def test_each_job_waits_for_its_fence_then_records_start_copies_and_end_in_order(
    runtime: Runtime, launcher: SaveLauncher
) -> None:
    one, many = Job(1, 100), Job(5, 200)
    assert one.submit(launcher, 0x51, (0xF1, 0xA1, 0xE1)) == 0
    assert many.submit(launcher, 0x52, (0xF2, 0xA2, 0xE2)) == 1
    launcher.drain()
    assert launcher.done() == 2
    assert runtime.calls == [
        ("device", 3),
        ("wait", 0x51, 0xF1),
        ("record", 0xA1, 0x51),
        ("memcpy", 0x51, one.copies()),  # a single copy goes through cudaMemcpyAsync
        ("record", 0xE1, 0x51),
        ("wait", 0x52, 0xF2),
        ("record", 0xA2, 0x52),
        ("batch", 0x52, many.copies()),
        ("record", 0xE2, 0x52),
    ]
    assert threading.get_ident() not in runtime.threads, "the calls run on the launcher's own thread"
    assert launcher.failure() is None


def test_long_jobs_are_cut_into_batch_calls_in_order() -> None:
    runtime = Runtime(fail_index=True, batch_max=4)
    launcher = SaveLauncher(runtime.entry, device=0)
    try:
        job = Job(10, 1000)
        job.submit(launcher, 7, (1, 2, 3))
        launcher.drain()
    finally:
        launcher.close()
    batches = [c for c in runtime.calls if c[0] == "batch"]
    assert [len(c[2]) for c in batches] == [4, 4, 2]
    assert [copy for c in batches for copy in c[2]] == job.copies()


def test_the_columns_are_copied_when_the_job_is_submitted(runtime: Runtime, launcher: SaveLauncher) -> None:
    job = Job(3, 300)
    expected = job.copies()
    job.submit(launcher, 1, (1, 2, 3))
    job.dst[:] = 0  # the planner's workspace is rewritten by the next plan at once
    launcher.drain()
    assert ("batch", 1, expected) in runtime.calls


def test_a_failing_call_is_named_and_every_later_job_is_skipped(
    runtime: Runtime, launcher: SaveLauncher
) -> None:
    runtime.fail[("record", 2)] = 700  # the second job's start event
    for n in range(3):
        Job(2, 10 * (n + 1)).submit(launcher, 0x50 + n, (0xF0 + n, 0xA0 + n, 0xE0 + n))
    launcher.drain()
    named = r"cudaEventRecord \(start\) of save job 1 failed with CUDA error 700"
    with pytest.raises(ECConnectorError, match=named):
        launcher.done()
    failure = launcher.failure()
    assert failure is not None and failure[0] == 1
    assert not [c for c in runtime.calls if 0x52 in c[1:2]], "the job after the failure was not queued"


def test_a_device_that_cannot_be_made_current_fails_every_job() -> None:
    runtime = Runtime()
    runtime.fail[("device", 0)] = 101
    launcher = SaveLauncher(runtime.entry, device=9)
    try:
        Job(2, 5).submit(launcher, 1, (1, 2, 3))
        launcher.drain()
        named = r"cudaSetDevice \(the launcher thread's device\) of save job 0"
        with pytest.raises(ECConnectorError, match=named):
            launcher.done()
    finally:
        launcher.close()
    assert runtime.calls == [("device", 9)]


def test_close_handles_what_is_queued_then_refuses_more(runtime: Runtime) -> None:
    launcher = SaveLauncher(runtime.entry, device=0)
    jobs = [Job(2, 10 * (n + 1)) for n in range(20)]
    for n, job in enumerate(jobs):
        job.submit(launcher, n + 1, (1, 2, 3))
    launcher.close()
    launcher.close()  # idempotent
    assert [c[1] for c in runtime.calls if c[0] == "batch"] == list(range(1, 21))
    with pytest.raises(ECConnectorError, match="the save launcher is closed"):
        jobs[0].submit(launcher, 1, (1, 2, 3))
    with pytest.raises(ECConnectorError, match="the save launcher is closed"):
        launcher.done()


FAKE_RUNTIME = r"""
#include <stddef.h>
#include <stdint.h>
#include <time.h>
static int64_t entries[1 << 16];
static int64_t count;
static void pause_a_little(void) { struct timespec t = {0, 100000}; nanosleep(&t, NULL); }
int fake_set_device(int device) { (void)device; return 0; }
int fake_wait(void *stream, void *event, unsigned flags) {
    (void)stream; (void)flags; pause_a_little(); entries[count++] = -(int64_t)(intptr_t)event; return 0;
}
int fake_record(void *event, void *stream) {
    (void)stream; entries[count++] = (int64_t)(intptr_t)event; return 0;
}
int fake_memcpy(void *dst, const void *src, size_t n, int kind, void *stream) {
    (void)src; (void)n; (void)kind; (void)stream; entries[count++] = (int64_t)(intptr_t)dst; return 0;
}
int fake_batch(int64_t *dst, void *src, void *size, size_t n, void *attrs, void *index, size_t n_attrs,
               void *stream) {
    (void)src; (void)size; (void)attrs; (void)index; (void)n_attrs; (void)stream;
    for (size_t i = 0; i < n; i++) entries[count++] = dst[i];
    return 0;
}
int64_t fake_count(void) { return count; }
int64_t *fake_entries(void) { return entries; }
"""


def test_a_full_queue_makes_submit_wait_for_room_and_every_job_runs_in_order(tmp_path: Path) -> None:
    """Two slots and forty jobs, against entry points in C (no GIL on the launcher's side): the
    submitting thread waits for room, slots are reused, and the driver sees each job's calls in
    order: fence wait, start, copies, end."""
    source = tmp_path / "fake_runtime.c"
    source.write_text(FAKE_RUNTIME)
    built = tmp_path / "fake_runtime.so"
    subprocess.run([native.compiler(), *native.FLAGS, "-o", str(built), str(source)], check=True)
    lib = ctypes.CDLL(str(built))
    lib.fake_count.restype = ctypes.c_int64
    lib.fake_entries.restype = ctypes.POINTER(ctypes.c_int64)
    address = [
        ctypes.cast(getattr(lib, f"fake_{n}"), _vp).value or 0 for n in ("set_device", "wait", "record")
    ]
    address += [ctypes.cast(getattr(lib, f"fake_{n}"), _vp).value or 0 for n in ("memcpy", "batch")]
    launcher = SaveLauncher(EntryPoints(*address, False, ATTRS, ATTR_INDEX, 256), device=0, slots=2)
    expected: list[int] = []
    try:
        for n in range(40):
            job = Job(3, 1000 * (n + 1))
            fence, start, end = 3 * n + 1, 3 * n + 2, 3 * n + 3
            assert job.submit(launcher, 9, (fence, start, end)) == n
            expected += [-fence, start, *job.dst.tolist(), end]
        launcher.drain()
        assert launcher.done() == 40
    finally:
        launcher.close()
    assert lib.fake_entries()[: lib.fake_count()] == expected


def test_a_launcher_without_slots_is_refused_by_name(runtime: Runtime) -> None:
    with pytest.raises(ECConnectorError, match="0 slots and batches of 256 copies must each be at least 1"):
        SaveLauncher(runtime.entry, device=0, slots=0)
