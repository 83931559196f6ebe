"""The CUDA engine's batch plan, compiled (batchplan.c), loaded with ctypes.PyDLL.

`BatchPlanner.load`/`save` validate a batch's runs, join the touching ones, and lay out the
copy-engine copies and the copy kernel's runs in one C call: what numpy did in 20-60 µs per batch of
32 on the engine's step thread. A batch that goes wholly to the copy engines can be queued in the
same call (`load_queued`/`save_queued`: the stream operations of queue.h), so the step thread pays
one call for planning and queueing it. The C reads the copies themselves (their packed extents and
rows) and takes its settings from slots of a shared int64 array, so the step thread makes no list,
buffer or array per batch and passes five arguments. The library is built on first use and cached
(build.py).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, cast

import numpy as np

from ec_connector.adapters.torch_copy.native import build
from ec_connector.adapters.torch_copy.native.build import QUEUE_CALLS
from ec_connector.adapters.torch_copy.plan import raise_for_extents
from ec_connector.domain.transfers import PlannedCopy

SOURCE = Path(__file__).with_name("batchplan.c")

# io[] slots, as batchplan.c numbers them (tests/adapters/test_batch_plan_slots.py compares the lists)
(
    IN_COPIES,
    IN_RUNS,
    IN_CAPACITY,
    IN_NUM_BLOCKS,
    IN_ROW_BYTES,
    IN_HOST,
    IN_DENSE,
    IN_ITEM_BYTES,
    IN_BIG_ROWS,
    IN_FEW_RUNS,
    IN_MIXED_MIN_RUNS,
    IN_BASE_ALIGN,
    IN_SAVE,
    IN_FEW_SHORT,
    OUT_BAD_COPY,
    OUT_TOTAL_ROWS,
    OUT_DMA,
    OUT_KERNEL,
    OUT_KERNEL_ROWS,
    OUT_WORD,
    OUT_VEC,
    OUT_DELTA,
    OUT_QUEUED,
    OUT_CALL,
    OUT_CUDA_ERROR,
    IN_DRIVER,
    IN_LOAD_ATTRS,
    IN_SAVE_ATTRS,
    IN_CALLER,
    IN_STREAM,
    IN_FENCE,
    IN_START,
    IN_END,
    IN_WORKSPACE,
    IN_SCRATCH,
    IN_SCRATCH_COPIES,
    IN_FEW_SHORT_MIN,
    IN_SHORT_PER_COPY,
    OUT_NEED_RUNS,
    OUT_NEED_COPIES,
) = range(40)
_OK, _BAD_CAPACITY = 0, 3
_SECTION_DMA_DST, _SECTION_DMA_SRC, _SECTION_DMA_SIZE, _SECTION_TABLE = range(4)
_vp = ctypes.c_void_p


class Queue(NamedTuple):
    """Where `BatchPlanner.load_queued`/`save_queued` queue a batch that goes wholly to the copy
    engines (queue.h): `fence` is recorded on the `caller` stream, and on the copy `stream` the wait
    for it, `start`, the copies and `end`; a load's caller stream then waits for `end`."""

    caller: int
    stream: int
    fence: int
    start: int
    end: int


class QueueFailed(Exception):
    """A CUDA call of a queued batch failed: `call` names it, `code` is the CUDA error; the calls
    after it were not made."""

    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call} failed with CUDA error {code}")
        self.call = call
        self.code = code


@dataclass(slots=True)
class BatchPlan:
    """One planned batch. Addresses point into the planner's workspace: valid until its next plan
    (and while the planner lives).

    `dma` copies (dst, src and size columns of int64 at the three addresses) go to the copy engines;
    `kernel` runs of `kernel_rows` rows to the copy kernel, with `word`/`vec` its access width and
    either `inline` (its arguments, at most INLINE_RUNS runs) or a staged table of `kernel * 3`
    int64 at `table` (columns first, start, delta; `delta` False when that column is all zero).
    """

    total_rows: int
    dma: int
    dma_dst: int
    dma_src: int
    dma_size: int
    kernel: int
    kernel_rows: int
    word: int
    vec: int
    delta: bool
    inline: tuple[int, ...] | None
    table: int


class BatchPlanner:
    """Plans batches for one region and one copy configuration (all sizes in blocks and bytes).

    `big_rows`: runs of at least this many rows go to the copy engines (None: none do);
    `few_runs`/`mixed_min_runs`: batches of at most that many runs (or, with a long run, that many)
    go wholly to the copy engines (`few_runs_save`, if given, in place of `few_runs` for saves);
    `few_short`/`short_per_copy`: so do batches with long runs and at most `few_short` short ones, or
    `short_per_copy` short ones per copy of the batch where that is more;
    `base_align`: OR of the row size and the region's device address.
    `driver`: address of queue.h's `ec_driver_t` (`CudaRuntime.driver_table`) and the batch
    attributes of loads and saves (`CudaRuntime.batch_attrs`), for `load_queued`/`save_queued`.
    """

    def __init__(
        self,
        *,
        num_blocks: int,
        row_bytes: int,
        host_address: int,
        big_rows: int | None,
        few_runs: int,
        mixed_min_runs: int,
        base_align: int,
        few_runs_save: int | None = None,
        few_short: int = 0,
        short_per_copy: int = 0,
        driver: tuple[int, int, int] | None = None,
    ) -> None:
        lib = library()
        self._plan = lib.ec_plan_copies
        self._access = lib.ec_plan_access
        self._access_out = np.zeros(2, dtype=np.int64)
        self._sections = int(lib.ec_plan_sections())
        self.inline_runs = int(lib.ec_plan_inline_runs())  # runs the kernel takes as arguments
        self._num_blocks = num_blocks
        self._io = np.zeros(int(lib.ec_plan_io_slots()), dtype=np.int64)
        # set and read through a memoryview: plain ints each way, cheaper than numpy's scalars
        io = self._slots = self._io.data
        if driver is not None:
            io[IN_DRIVER], io[IN_LOAD_ATTRS], io[IN_SAVE_ATTRS] = driver
        io[IN_NUM_BLOCKS] = num_blocks
        io[IN_ROW_BYTES] = row_bytes
        io[IN_HOST] = host_address
        io[IN_BIG_ROWS] = -1 if big_rows is None else big_rows
        self._few_runs_load = few_runs
        self._few_runs_save = few_runs if few_runs_save is None else few_runs_save
        io[IN_FEW_SHORT_MIN] = few_short
        io[IN_SHORT_PER_COPY] = short_per_copy
        io[IN_MIXED_MIN_RUNS] = mixed_min_runs
        io[IN_BASE_ALIGN] = base_align
        self._io_address = self._io.ctypes.data
        self._capacity = 0
        self._workspace = self._scratch = np.zeros(0, dtype=np.int64)
        self._grow(1024, 64)

    def access(self, align: int) -> tuple[int, int]:
        """(word bytes, words per 16-byte access) the kernel uses for addresses all multiples of
        `align`: the rule each plan applies, for compiling kernel variants ahead of time."""
        out = self._access_out
        self._access(align, out.ctypes.data)
        return int(out[0]), int(out[1])

    def save(
        self, copies: Sequence[PlannedCopy], pointers: list[int], offsets: list[int], item_bytes: int
    ) -> BatchPlan:
        """Plan copying payload i (its first row at `pointers[i]`, `offsets[i]` elements of
        `item_bytes` into its storage) into copy i's extents. LayoutMismatch names a bad copy."""
        return cast(BatchPlan, self.save_queued(copies, pointers, offsets, item_bytes, None))

    def load(self, copies: Sequence[PlannedCopy], dense: int) -> BatchPlan:
        """Plan copying each copy's extents to rows back to back from address `dense`."""
        return cast(BatchPlan, self.load_queued(copies, dense, None))

    def save_queued(
        self,
        copies: Sequence[PlannedCopy],
        pointers: list[int],
        offsets: list[int],
        item_bytes: int,
        queue: Queue | None,
    ) -> BatchPlan | None:
        """`save`, and a batch wholly on the copy engines queued at once on `queue` (None then)."""
        io = self._slots
        io[IN_SAVE] = 1
        io[IN_FEW_RUNS] = self._few_runs_save
        io[IN_ITEM_BYTES] = item_bytes
        return self._run(copies, pointers, offsets, queue)

    def load_queued(self, copies: Sequence[PlannedCopy], dense: int, queue: Queue | None) -> BatchPlan | None:
        """`load`, and a batch wholly on the copy engines queued at once on `queue`, the caller's
        stream waiting for its end (None then). QueueFailed when a CUDA call fails."""
        io = self._slots
        io[IN_SAVE] = 0
        io[IN_FEW_RUNS] = self._few_runs_load
        io[IN_DENSE] = dense
        return self._run(copies, None, None, queue)

    def _run(
        self,
        copies: Sequence[PlannedCopy],
        pointers: list[int] | None,
        offsets: list[int] | None,
        queue: Queue | None,
    ) -> BatchPlan | None:
        """Plan (and with `queue`, queue a batch wholly on the copy engines: None then)."""
        io = self._slots
        if queue is not None:
            if not io[IN_DRIVER]:
                raise ValueError("this BatchPlanner was built without a driver table; it cannot queue")
            io[IN_CALLER], io[IN_STREAM], io[IN_FENCE], io[IN_START], io[IN_END] = queue
        queued = queue is not None
        err = self._plan(self._io_address, copies, pointers, offsets, queued)
        if err == _BAD_CAPACITY:  # a batch larger than any before: grow, then plan it again
            self._grow(io[OUT_NEED_RUNS], io[OUT_NEED_COPIES])
            err = self._plan(self._io_address, copies, pointers, offsets, queued)
        if err != _OK:
            if err == _BAD_CAPACITY:  # pragma: no cover - grown above
                raise AssertionError("the batch planner's workspace was not grown")
            raise_for_extents(copies, self._num_blocks)
        if queued and io[OUT_QUEUED]:
            if io[OUT_CUDA_ERROR]:
                call = QUEUE_CALLS.get(io[OUT_CALL], f"call {io[OUT_CALL]}")
                raise QueueFailed(call, io[OUT_CUDA_ERROR])
            return None
        total, dma, kernel, kernel_rows, word, vec, delta = io[OUT_TOTAL_ROWS : OUT_DELTA + 1].tolist()
        at = io[IN_WORKSPACE]
        step = self._capacity * 8
        table = at + _SECTION_TABLE * step
        inline = None
        if 0 < kernel <= self.inline_runs:
            n = 3 * self.inline_runs - 1
            start = _SECTION_TABLE * self._capacity
            inline = tuple(self._workspace[start : start + n].tolist())
        return BatchPlan(
            total,
            dma,
            at + _SECTION_DMA_DST * step,
            at + _SECTION_DMA_SRC * step,
            at + _SECTION_DMA_SIZE * step,
            kernel,
            kernel_rows,
            word,
            vec,
            bool(delta),
            inline,
            table,
        )

    def _grow(self, runs: int, copies: int) -> None:
        """Room for batches of `runs` runs and `copies` copies (each rounded up to a power of two)."""
        io = self._slots
        capacity = max(self._capacity, 1 << max(runs - 1, 0).bit_length())
        room = max(io[IN_SCRATCH_COPIES], 1 << max(copies - 1, 0).bit_length())
        if capacity > self._capacity:
            self._workspace = np.zeros(self._sections * capacity, dtype=np.int64)
            self._capacity = io[IN_CAPACITY] = capacity
            io[IN_WORKSPACE] = self._workspace.ctypes.data
        # the copies' columns (rows, counts, pointers, offsets), then their runs as pairs
        self._scratch = np.zeros(4 * room + 2 * capacity, dtype=np.int64)
        io[IN_SCRATCH] = self._scratch.ctypes.data
        io[IN_SCRATCH_COPIES] = room


_library: ctypes.CDLL | None = None
_lock = threading.Lock()


def library() -> ctypes.CDLL:
    """The compiled planner, built on first use (once per source and compiler, then cached)."""
    global _library
    with _lock:
        if _library is None:
            # short pure computation that reads Python objects: keeps the GIL (PyDLL raises what it sets)
            lib = ctypes.PyDLL(str(build.build(SOURCE, "the batch planner", python=True)))
            obj = ctypes.py_object
            lib.ec_plan_copies.argtypes = [_vp, obj, obj, obj, ctypes.c_int64]
            lib.ec_plan_copies.restype = ctypes.c_int64
            lib.ec_plan_access.argtypes = [ctypes.c_int64, _vp]
            lib.ec_plan_access.restype = None
            for name in ("ec_plan_sections", "ec_plan_io_slots", "ec_plan_inline_runs"):
                getattr(lib, name).restype = ctypes.c_int64
            _library = lib
        return _library
