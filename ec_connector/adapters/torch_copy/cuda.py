"""CUDA engine: each batch is one stream-ordered sequence on a pooled copy stream (or the caller's own).

    caller stream --fence--> copy stream: start event, [run table upload, copy kernel for the short
    runs], [one batched cudaMemcpyAsync of the long runs], end event

A batch that goes wholly to the copy engines is planned and queued in one native call
(`BatchPlanner.load_queued`/`save_queued`, batchplan.c with queue.h): the fence, the stream
operations and the copies cost the step thread one ctypes call instead of a plan and six runtime
calls from Python. Such a load called from a stream of the caller's own (not the legacy default
stream) goes onto that stream itself: start event, copies, end event, nothing to fence or join.
With the save launcher on (`launcher`), a save wholly on the copy engines is handed, planned, to
launcher.c instead: the step thread records the fence and returns, and the launcher's native
thread queues the rest on a copy stream of its own (the driver's ~1 µs per copy off the step
thread). Loads, and saves with kernel runs (the Triton launch is Python), are queued by the calling
thread.

Long runs (>= `dma_min_bytes`) go to the copy engines, which reach the PCIe limit; short runs go to
one Triton kernel that reads or writes the region through its mapped device address, so a batch
costs one launch whatever its fragmentation. No per-row host work and no host synchronisation;
the launch path uses raw runtime calls (cudart.py) and pre-compiled kernels (kernels.Launcher).
Sources stay referenced until the end event has fired; load outputs are allocated on the caller's
stream and the caller's stream waits on the end event, so anything queued after `load` sees the
bytes (and memory reused after the outputs are freed is written only after the copy). The batch
plan (validation, joining touching runs, the split between copy engines and kernel, the kernel's
run table) is one call into compiled C (batchplan.c), so host time barely grows with runs.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

import torch

from ec_connector.adapters.torch_copy import hostmem
from ec_connector.adapters.torch_copy.cpu import release_view
from ec_connector.adapters.torch_copy.cudart import runtime
from ec_connector.adapters.torch_copy.native.batchplan import BatchPlan, BatchPlanner, Queue, QueueFailed
from ec_connector.adapters.torch_copy.native.launcher import SaveLauncher
from ec_connector.adapters.torch_copy.plan import CopyTiming
from ec_connector.domain.errors import ECConnectorError, RegionError
from ec_connector.domain.transfers import PlannedCopy
from ec_connector.ports.region import Region

_WORD_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# A batch of this many runs or fewer goes wholly to the copy engines: on the H200 a copy-engine
# copy costs ~5 µs on top of its bytes, while a kernel over a few hundred KiB of mapped host pages
# lost ~25 µs to its first accesses (64-row entries of 7 KiB rows in 2 runs: 0.45x memcpy).
FEW_RUNS = 4
# Saves of at most this many runs go wholly to the copy engines too: a device-to-host copy-engine
# copy costs ~1 µs on top of its bytes (host-to-device ~3.5), and the copy engines need no kernel
# launch (~8 µs of host enqueue inside a batch-1 copy's window on an idle stream). H200:
# batch-1 64-row entries in 9-10 runs saved at 0.59-0.77x memcpy against 0.43-0.68x through the
# kernel, at the same device time.
FEW_RUNS_SAVE = 16
# A batch with long runs and at most this many runs goes wholly to the copy engines too: side by
# side, the kernel's fixed cost (~20 µs before its first bytes land) and the join of the two streams
# sat on top of the copies (a 2 MiB entry of 32 KiB rows in 8 runs of 1-16 rows: 0.54x memcpy mixed,
# 0.81x on the copy engines alone).
MIXED_MIN_RUNS = 16
# A batch of long runs with at most this many short ones, or one short one per entry where that is
# more (what the tier's run floor leaves: the last piece of a split entry, or an entry under the
# floor), goes wholly to the copy engines too: each short run then costs a descriptor instead of the
# kernel's launch and the join of two streams. Loads take it with their sources read out of stream
# order (`source_settled`): in stream order, short host-to-device copies behind long ones held the
# driver call for ~2.3 ms in batches of 512 MiB, and a raw probe of such batches took
# 1.3-1.5x the host time of the out-of-order read. H200,
# `bench/copy_short_runs.py` (batches of 32 on the tier's aged layout, rules in turn call by call):
# host time (p10) of loads 117-327 -> 77-205 µs and of saves 104-320 -> 81-196 against every short
# run on the kernel, gated device time equal or lower (0.90-0.99x memcpy -> 0.94-1.06x). Layouts of
# many short runs (no run floor) stay mixed: wholly on the copy engines, 32 entries of 16 MiB of
# 32 KiB rows in runs of 1-16 rows took 1.0-1.1 ms of host time against 0.7-0.8.
FEW_SHORT = 16
SHORT_PER_COPY = 1

_data_ptr: Callable[[torch.Tensor], int] = torch.Tensor.data_ptr  # type: ignore[assignment]
_storage_offset: Callable[[torch.Tensor], int] = torch.Tensor.storage_offset  # type: ignore[assignment]


class _Slot:
    """Pinned staging and device copy of one batch's run table; reused once that batch has ended."""

    def __init__(self, runs: int, device: torch.device) -> None:
        self.capacity = runs
        self.pinned = torch.empty(3 * runs, dtype=torch.int64, pin_memory=True)
        self.device = torch.empty(3 * runs, dtype=torch.int64, device=device)
        self.table = self.pinned.numpy()
        self.pinned_address = self.pinned.data_ptr()
        self.device_address = self.device.data_ptr()
        self.staged_bytes = 0


@dataclass(slots=True)
class _Batch:
    direction: str
    tickets: list[int]
    nbytes: int
    start: int
    end: int
    slot: _Slot | None
    keep: tuple[torch.Tensor, ...]
    job: int = -1  # the save launcher's job number (-1: queued by the caller)
    fence: int = 0  # the job's fence event, pooled again once the batch has ended


class CudaEngine:
    def __init__(
        self,
        region: Region,
        dtype: torch.dtype,
        device: torch.device,
        *,
        streams: int,
        tile_bytes: int,
        num_warps: int,
        dma_min_bytes: int | None,
        launcher: bool = False,
    ) -> None:
        from ec_connector.adapters.torch_copy import kernels

        if streams < 1:
            raise ValueError(f"TorchCopier streams must be >= 1, got {streams}")
        lay = region.layout
        if lay.num_blocks >= 1 << 31:
            raise ValueError(f"region {region.name!r} has {lay.num_blocks} blocks; at most 2**31 - 1")
        self._rt = runtime()
        self._device = device
        self._index = device.index
        self._dtype = dtype
        self._width = lay.hidden_dim
        self._row_bytes = lay.block_size_bytes
        rb = self._row_bytes
        self._big_rows = None if dma_min_bytes is None else max(1, -(-dma_min_bytes // rb))
        self._view: memoryview | None = region.data()
        self._host: torch.Tensor | None = torch.frombuffer(self._view, dtype=torch.uint8)
        address = self._host.data_ptr()
        declared = getattr(region, "data_address", None)
        if callable(declared) and declared() != address:
            raise RegionError(
                f"region {region.name!r} says its data starts at {declared():#x} but its data() view "
                f"starts at {address:#x}; the region adapter is inconsistent"
            )
        self._registration = hostmem.acquire(address, lay.data_bytes, device, name=region.name)
        try:
            self._region = hostmem.device_view(self._registration.device_address, lay.data_bytes, device)
        except Exception:
            hostmem.release(self._registration)
            raise
        self._region_words = {w: self._region.view(t) for w, t in _WORD_DTYPES.items() if rb % w == 0}
        self._base_align = rb | self._registration.device_address
        self._launcher = kernels.Launcher(rb, tile_bytes=tile_bytes, num_warps=num_warps)
        self._planner = BatchPlanner(
            num_blocks=lay.num_blocks,
            row_bytes=rb,
            host_address=address,
            big_rows=self._big_rows,
            few_runs=FEW_RUNS,
            few_runs_save=FEW_RUNS_SAVE,
            mixed_min_runs=MIXED_MIN_RUNS,
            few_short=FEW_SHORT,
            short_per_copy=SHORT_PER_COPY,
            base_align=self._base_align,
            driver=(
                int(self._rt.driver_table().ctypes.data),
                self._rt.batch_attrs(source_settled=True),
                self._rt.batch_attrs(source_settled=False),
            ),
        )
        if self._planner.inline_runs != kernels.INLINE_RUNS:  # pragma: no cover - a build mismatch
            raise RegionError(
                f"batchplan.c passes {self._planner.inline_runs} runs inline but the copy kernel "
                f"takes {kernels.INLINE_RUNS}; rebuild from one source tree"
            )
        with torch.cuda.device(device):
            self._save_streams = [torch.cuda.Stream(device) for _ in range(streams)]
            self._load_streams = [torch.cuda.Stream(device) for _ in range(streams)]
            self._side = {
                s.cuda_stream: torch.cuda.Stream(device) for s in self._save_streams + self._load_streams
            }
        # saves wholly on the copy engines go through the launcher's thread (started at the first
        # such save: ranks that never save have none), on streams of their own (the caller's streams
        # would order its queued work after the launcher's, unpredictably)
        self._launch_saves = launcher and self._rt.has_batch_copy
        self._save_launcher: SaveLauncher | None = None
        self._launched_streams: list[torch.cuda.Stream] = []
        self._fences: list[int] = []
        self._fence = self._rt.event(timing=False)
        self._join = self._rt.event(timing=False)
        self._turn = 0
        self._pending: list[_Batch] = []
        self._events: list[tuple[int, int]] = []
        self._slots: list[_Slot] = []
        self._timings: list[CopyTiming] = []
        self._no_table = torch.zeros(3, dtype=torch.int64, device=device)
        self._warmup()

    @property
    def launches_saves(self) -> bool:
        return self._launch_saves

    # -- the two directions -------------------------------------------------------------------

    def save(self, copies: Sequence[PlannedCopy], sources: list[torch.Tensor]) -> None:
        """`sources`: contiguous payloads, one per copy (the copier validated them)."""
        caller = torch._C._cuda_getCurrentRawStream(self._index)
        pointers, offsets = list(map(_data_ptr, sources)), list(map(_storage_offset, sources))
        item = sources[0].element_size()
        if self._launch_saves:
            plan = self._planner.save(copies, pointers, offsets, item)
            if plan.kernel == 0:
                self._hand_over(plan, copies, caller, sources)
                return
            self._submit(
                "save", plan, copies, caller, self._next(self._save_streams), sources, self._take_events()
            )
            return
        stream = self._next(self._save_streams)
        start, end = events = self._take_events()
        queue = Queue(caller, stream.cuda_stream, self._fence, start, end)
        try:
            queued = self._planner.save_queued(copies, pointers, offsets, item, queue)
        except BaseException as err:
            self._unplanned(events, err, "save")
        if queued is None:  # planned and queued in one native call
            nbytes = sum(c.rows for c in copies) * self._row_bytes
            self._pending.append(
                _Batch("save", [c.ticket for c in copies], nbytes, start, end, None, tuple(sources))
            )
            return
        self._submit("save", queued, copies, caller, stream, sources, events)

    def load(self, copies: Sequence[PlannedCopy]) -> tuple[torch.Tensor, ...]:
        caller = torch._C._cuda_getCurrentRawStream(self._index)
        rows = [c.rows for c in copies]
        total = sum(rows)
        out = torch.empty((total, self._width), dtype=self._dtype, device=self._device)
        stream = self._next(self._load_streams)
        start, end = events = self._take_events()
        # A copy-engine load goes onto the caller's own stream when it has one (vLLM's model runner
        # makes a stream per process): stream order alone puts it after the work queued there and
        # before what comes next, with no fence or join. From the legacy default stream (0), which
        # cudaMemcpyBatchAsync refuses, it goes to a copy stream behind a fence, joined after.
        queue = Queue(caller, caller or stream.cuda_stream, self._fence, start, end)
        try:
            plan = self._planner.load_queued(copies, out.data_ptr(), queue)
        except BaseException as err:
            self._unplanned(events, err, "load")
        if plan is None:  # planned, queued and joined to the caller's stream in one native call
            self._pending.append(
                _Batch("load", [c.ticket for c in copies], total * self._row_bytes, start, end, None, ())
            )
        else:
            self._submit("load", plan, copies, caller, stream, [out], events)
            self._rt.wait(caller, end)
        # No record_stream: `out` belongs to the caller's stream, which waits for the end event, so
        # whatever reuses its memory after it is freed is queued behind the copy.
        # One op for the per-entry views: on the H200 host (torch 2.11) 32 views took
        # 20-33 µs this way, 23-35 through `split` (a Python wrapper over it) and 26-42 through
        # view + unbind, equal entries or not.
        return out.split_with_sizes(rows)

    def _unplanned(self, events: tuple[int, int], err: BaseException, direction: str) -> NoReturn:
        """A batch's planning or queueing failed: its events go back to the pool, and a failed CUDA
        call raises as the runtime's own calls do (the calls after it were not made)."""
        self._events.append(events)
        if isinstance(err, QueueFailed):
            self._rt.check(err.code, f"{err.call} of a {direction} batch")
        raise err

    # -- completion ------------------------------------------------------------------------------

    def poll(self) -> list[int]:
        done: list[int] = []
        still: list[_Batch] = []
        # jobs at and past this number are not yet on their streams (their events not yet recorded)
        launched = self._save_launcher.done() if self._save_launcher is not None else 0
        for batch in self._pending:
            if batch.job >= launched:
                still.append(batch)
            elif self._rt.done(batch.end):
                done += batch.tickets
                self._retire(batch)
            else:
                still.append(batch)
        self._pending = still
        return done

    def in_flight(self) -> int:
        return sum(len(b.tickets) for b in self._pending)

    def drain_timings(self) -> list[CopyTiming]:
        out, self._timings = self._timings, []
        return out

    def close(self) -> list[int]:
        """Wait for every batch, unregister, release the region view; returns the tickets not polled."""
        done: list[int] = []
        failure = None
        if self._save_launcher is not None:
            self._save_launcher.drain()
            failure = self._save_launcher.failure()
            self._save_launcher.close()
        failed_from = failure[0] if failure is not None else 1 << 62
        for batch in self._pending:
            if batch.job < failed_from:  # queued on its stream: wait for it before unregistering
                self._rt.synchronize(batch.end)
                done += batch.tickets
            self._events.append((batch.start, batch.end))
            if batch.fence:
                self._fences.append(batch.fence)
        self._pending = []
        for start, end in self._events:
            self._rt.destroy(start)
            self._rt.destroy(end)
        for fence in self._fences:
            self._rt.destroy(fence)
        self._fences = []
        self._rt.destroy(self._fence)
        self._rt.destroy(self._join)
        self._events = []
        self._slots = []
        self._region_words = {}
        del self._region
        hostmem.release(self._registration)
        self._host = None
        if self._view is not None:
            release_view(self._view)
            self._view = None
        if failure is not None:
            raise ECConnectorError(
                f"{failure[1]}; the copies of its batch and of every later save were not made"
            )
        return done

    # -- internals -------------------------------------------------------------------------------

    def _next(self, streams: list[torch.cuda.Stream]) -> torch.cuda.Stream:
        self._turn += 1
        return streams[self._turn % len(streams)]

    def _submit(
        self,
        direction: str,
        plan: BatchPlan,
        copies: Sequence[PlannedCopy],
        caller: int,
        stream_obj: torch.cuda.Stream,
        dense: list[torch.Tensor],
        events: tuple[int, int],
    ) -> None:
        """Queue a planned batch with kernel runs on `stream_obj`, between the `events` (start, end)
        from the pool (the planner queues the batches wholly on the copy engines in its own native
        call, the save launcher those it takes).

        `dense`: one tensor per copy (saves, kept alive until the end event) or one for the whole
        batch (loads, the caller's); the plan's addresses are into them.
        """
        save = direction == "save"
        # bound before the batch's first stream operation: the kernel starts as soon as queued
        slot, fire = self._kernel_launch(plan, dense[0], save)
        rt = self._rt
        start, end = events
        stream = stream_obj.cuda_stream
        side = self._side[stream].cuda_stream if plan.dma else 0  # the copy engines beside the kernel
        rt.record(self._fence, caller)
        rt.wait(stream, self._fence)
        rt.record(start, stream)
        if side:
            rt.wait(side, start)
        if slot is not None:
            rt.memcpy(slot.device_address, slot.pinned_address, slot.staged_bytes, stream)
        fire(stream)
        if side:
            # a load reads region blocks of committed entries, which nothing writes while the
            # scheduler's lease holds them; a save reads payloads the caller's stream produced
            columns = (plan.dma_dst, plan.dma_src, plan.dma_size, plan.dma)
            rt.memcpy_batch(*columns, side, source_settled=not save)
            rt.record(self._join, side)
            rt.wait(stream, self._join)
        rt.record(end, stream)
        keep = tuple(dense) if save else ()
        tickets = [c.ticket for c in copies]
        self._pending.append(
            _Batch(direction, tickets, plan.total_rows * self._row_bytes, start, end, slot, keep)
        )

    def _hand_over(
        self, plan: BatchPlan, copies: Sequence[PlannedCopy], caller: int, sources: list[torch.Tensor]
    ) -> None:
        """Record the batch's fence on the caller's stream and submit its copies to the launcher."""
        rt = self._rt
        start, end = self._take_events()
        fence = self._fences.pop() if self._fences else rt.event(timing=False)
        rt.record(fence, caller)
        launcher = self._save_launcher
        if launcher is None:
            launcher = self._save_launcher = SaveLauncher(self._rt.entry_points(), self._index)
            with torch.cuda.device(self._device):
                self._launched_streams = [torch.cuda.Stream(self._device) for _ in self._save_streams]
        stream = self._next(self._launched_streams).cuda_stream
        columns = (plan.dma_dst, plan.dma_src, plan.dma_size, plan.dma)
        job = launcher.submit(stream, fence, start, end, *columns)
        tickets = [c.ticket for c in copies]
        nbytes = plan.total_rows * self._row_bytes
        self._pending.append(_Batch("save", tickets, nbytes, start, end, None, tuple(sources), job, fence))

    def _kernel_launch(
        self, plan: BatchPlan, first: torch.Tensor, save: bool
    ) -> tuple[_Slot | None, Callable[[int], None]]:
        """Stage the kernel's run table (unless its runs go inline) and bind its launch; (slot, fire).

        `first`: the tensor the kernel's dense word offsets count from (the first payload, or the
        load's output).
        """
        slot = None
        if plan.inline is None:
            slot = self._take_slot(plan.kernel)
            slot.staged_bytes = 3 * plan.kernel * 8
            ctypes.memmove(slot.pinned_address, plan.table, slot.staged_bytes)
        fire = self._launcher.bind(
            self._region_words[plan.word],
            first.view(_WORD_DTYPES[plan.word]),
            self._no_table if slot is None else slot.device,
            word=plan.word,
            vec=plan.vec,
            n_runs=plan.kernel,
            total_rows=plan.kernel_rows,
            inline=plan.inline,
            save=save,
            delta=plan.delta,
        )
        if fire is None:  # pragma: no cover - a kernel plan has rows (each run at least one)
            raise AssertionError("a batch planned with kernel runs has no kernel rows")
        return slot, fire

    def _retire(self, batch: _Batch) -> None:
        seconds = self._rt.elapsed(batch.start, batch.end)
        self._timings.append(CopyTiming(batch.direction, tuple(batch.tickets), batch.nbytes, seconds))
        self._events.append((batch.start, batch.end))
        if batch.slot is not None:
            self._slots.append(batch.slot)
        if batch.fence:
            self._fences.append(batch.fence)

    def _take_events(self) -> tuple[int, int]:
        """A (start, end) pair of timing events for a batch: a pooled one, else new."""
        if self._events:
            return self._events.pop()
        return self._rt.event(timing=True), self._rt.event(timing=True)

    def _take_slot(self, runs: int) -> _Slot:
        for i, slot in enumerate(self._slots):
            if slot.capacity >= runs:
                return self._slots.pop(i)
        return _Slot(max(1024, 1 << (runs - 1).bit_length()), self._device)

    def _warmup(self) -> None:
        """Compile the variants a 16-byte-aligned batch uses now, not on the engine's first step."""
        word, vec = self._planner.access(self._base_align | 16)
        dense = torch.empty(64, dtype=_WORD_DTYPES[word], device=self._device)
        for save, delta, inline in (
            (True, False, True),
            (False, False, True),
            (True, True, False),
            (True, False, False),
            (False, True, False),
            (False, False, False),
        ):
            self._launcher.prepare(
                self._region_words[word],
                dense,
                self._no_table,
                word=word,
                vec=vec,
                inline=inline,
                save=save,
                delta=delta,
            )
