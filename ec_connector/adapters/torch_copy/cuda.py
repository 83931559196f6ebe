"""CUDA engine: each batch is one stream-ordered sequence on a pooled copy stream.

    caller stream --fence--> copy stream: start event, [run table upload, copy kernel for the short
    runs], [one batched cudaMemcpyAsync of the long runs], end event

Long runs (>= `dma_min_bytes`) go to the copy engines, which reach the PCIe limit; short runs go to
one Triton kernel that reads or writes the region through its mapped device address, so a batch
costs one launch whatever its fragmentation. No per-row host work and no host synchronisation;
the launch path uses raw runtime calls (cudart.py) and pre-compiled kernels (kernels.Launcher).
Sources stay referenced until the end event has fired; load outputs are allocated on the caller's
stream and the caller's stream waits on the end event, so anything queued after `load` sees the
bytes (and memory reused after the outputs are freed is written only after the copy). The batch
plan is a few numpy operations over the whole batch (plan.py), so host time barely grows with runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
import torch

from ec_connector.adapters.torch_copy import hostmem
from ec_connector.adapters.torch_copy.cpu import release_view
from ec_connector.adapters.torch_copy.cudart import runtime
from ec_connector.adapters.torch_copy.plan import CopyTiming, Runs
from ec_connector.domain.errors import RegionError
from ec_connector.ports.region import Region

_WORD_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# A batch of this many runs or fewer goes wholly to the copy engines: on the H200 a copy-engine
# copy costs ~5 µs on top of its bytes, while a kernel over a few hundred KiB of mapped host pages
# lost ~25 µs to its first accesses (64-row entries of 7 KiB rows in 2 runs: 0.45x memcpy).
FEW_RUNS = 4
# A batch with long runs and at most this many runs goes wholly to the copy engines too: side by
# side, the kernel's fixed cost (~20 µs before its first bytes land) and the join of the two streams
# sat on top of the copies (a 2 MiB entry of 32 KiB rows in 8 runs of 1-16 rows: 0.54x memcpy mixed,
# 0.81x on the copy engines alone).
MIXED_MIN_RUNS = 16

_ALL: Final = slice(None)  # every run of the batch
Selection = slice | np.ndarray | None  # _ALL, a boolean mask over the runs, or no run
_data_ptr = torch.Tensor.data_ptr


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
    ) -> None:
        from ec_connector.adapters.torch_copy import kernels

        if streams < 1:
            raise ValueError(f"TorchCopier streams must be >= 1, got {streams}")
        lay = region.layout
        if lay.num_blocks >= 1 << 31:
            raise ValueError(f"region {region.name!r} has {lay.num_blocks} blocks; at most 2**31 - 1")
        self._kernels = kernels
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
        self._host_address = address
        self._region_words = {w: self._region.view(t) for w, t in _WORD_DTYPES.items() if rb % w == 0}
        self._base_align = rb | self._registration.device_address
        self._launcher = kernels.Launcher(rb, tile_bytes=tile_bytes, num_warps=num_warps)
        with torch.cuda.device(device):
            self._save_streams = [torch.cuda.Stream(device) for _ in range(streams)]
            self._load_streams = [torch.cuda.Stream(device) for _ in range(streams)]
            self._side = {
                s.cuda_stream: torch.cuda.Stream(device) for s in self._save_streams + self._load_streams
            }
        self._fence = self._rt.event(timing=False)
        self._join = self._rt.event(timing=False)
        self._turn = 0
        self._pending: list[_Batch] = []
        self._events: list[tuple[int, int]] = []
        self._slots: list[_Slot] = []
        self._timings: list[CopyTiming] = []
        self._no_table = torch.zeros(3, dtype=torch.int64, device=device)
        self._warmup()

    # -- the two directions -------------------------------------------------------------------

    def save(self, runs: Runs, sources: list[torch.Tensor]) -> None:
        """`sources`: contiguous payloads, one per copy (the copier validated them)."""
        caller = torch._C._cuda_getCurrentRawStream(self._index)
        rb = self._row_bytes
        pointers = np.fromiter(map(_data_ptr, sources), np.int64, len(sources))
        if runs.one_run_each:
            at = pointers
        else:  # run i's rows start at its payload's address plus its rows before it in the payload
            at = runs.per_run(pointers - runs.entry_firsts() * rb) + runs.firsts * rb
        stream = self._next(self._save_streams)
        self._submit("save", runs, caller, stream, at, sources)

    def load(self, runs: Runs) -> tuple[torch.Tensor, ...]:
        caller = torch._C._cuda_getCurrentRawStream(self._index)
        out = torch.empty((runs.total_rows, self._width), dtype=self._dtype, device=self._device)
        at = out.data_ptr() + runs.firsts * self._row_bytes
        stream = self._next(self._load_streams)
        end = self._submit("load", runs, caller, stream, at, [out])
        # No record_stream: `out` belongs to the caller's stream, which waits here for the end event,
        # so whatever reuses its memory after it is freed is queued behind the copy.
        self._rt.wait(caller, end)
        return out.split(runs.rows)

    # -- completion ------------------------------------------------------------------------------

    def poll(self) -> list[int]:
        done: list[int] = []
        still: list[_Batch] = []
        for batch in self._pending:
            if self._rt.done(batch.end):
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
        for batch in self._pending:
            self._rt.synchronize(batch.end)
            done += batch.tickets
            self._events.append((batch.start, batch.end))
        self._pending = []
        for start, end in self._events:
            self._rt.destroy(start)
            self._rt.destroy(end)
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
        return done

    # -- internals -------------------------------------------------------------------------------

    def _next(self, streams: list[torch.cuda.Stream]) -> torch.cuda.Stream:
        self._turn += 1
        return streams[self._turn % len(streams)]

    def _submit(
        self,
        direction: str,
        runs: Runs,
        caller: int,
        stream_obj: torch.cuda.Stream,
        at: np.ndarray,
        dense: list[torch.Tensor],
    ) -> int:
        """Queue the batch on `stream_obj`; returns its end event.

        Run i's rows are at device address `at[i]` onward, in `dense`: one tensor per copy (saves,
        kept alive until the end event) or one for the whole batch (loads, the caller's).
        """
        save = direction == "save"
        rb = self._row_bytes
        starts, lengths, firsts = runs.starts, runs.lengths, runs.firsts
        if len(lengths) > FEW_RUNS:
            owners = _Owners(runs, dense) if save else None
            starts, lengths, firsts, at = _join_touching(starts, lengths, firsts, at, rb, owners)
        dma, kernel = self._split(lengths)

        slot: _Slot | None = None
        fire = None
        if kernel is not None:
            slot, fire = self._kernel_launch(runs, starts, lengths, firsts, at, kernel, dense, save)
        if dma is not None:
            hosts = self._host_address + starts[dma] * rb
            denses = at[dma]
            sizes = lengths[dma] * rb
            dsts, srcs = (hosts, denses) if save else (denses, hosts)

        rt = self._rt
        start, end = self._events.pop() if self._events else (rt.event(timing=True), rt.event(timing=True))
        stream = stream_obj.cuda_stream
        side = self._side[stream] if dma is not None and fire is not None else None
        rt.record(self._fence, caller)
        rt.wait(stream, self._fence)
        rt.record(start, stream)
        if side is not None:  # kernel and copy engines side by side
            rt.wait(side.cuda_stream, start)
        if fire is not None:
            if slot is not None:
                rt.memcpy(slot.device_address, slot.pinned_address, slot.staged_bytes, stream)
            fire(stream)
        if dma is not None:
            rt.memcpy_many(dsts, srcs, sizes, stream if side is None else side.cuda_stream)
        if side is not None:
            rt.record(self._join, side.cuda_stream)
            rt.wait(stream, self._join)
        rt.record(end, stream)
        keep = tuple(dense) if save else ()
        self._pending.append(_Batch(direction, runs.tickets, runs.total_rows * rb, start, end, slot, keep))
        return end

    def _kernel_launch(
        self,
        runs: Runs,
        starts: np.ndarray,
        lengths: np.ndarray,
        firsts: np.ndarray,
        at: np.ndarray,
        kernel: slice | np.ndarray,
        dense: list[torch.Tensor],
        save: bool,
    ) -> tuple[_Slot | None, Callable[[int], None] | None]:
        """Stage the kernel's runs (or pass them inline) and bind its launch; (slot, fire)."""
        rb = self._row_bytes
        if kernel is _ALL:
            k_starts, k_lengths, k_firsts, k_rows, k_at = starts, lengths, firsts, runs.total_rows, at
        else:
            k_starts, k_lengths, k_at = starts[kernel], lengths[kernel], at[kernel]
            k_ends = np.cumsum(k_lengths)
            k_rows = int(k_ends[-1])
            k_firsts = k_ends - k_lengths
        base = dense[0].data_ptr()
        if save:  # every payload's address and the region's decide the widest common access
            word, vec = _word(self._base_align | base | int(np.bitwise_or.reduce(k_at)))
        else:
            word, vec = _word(self._base_align | base)
        offsets = (k_at - base) // word  # dense word where each run's first row goes
        slot = None
        inline = None
        delta: np.ndarray | None = None
        if len(k_starts) <= self._kernels.INLINE_RUNS:
            inline = self._kernels.inline_runs(
                k_starts.tolist(), k_lengths.tolist(), offsets.tolist(), k_rows
            )
        else:
            # from the table, the kernel puts its row r of run i at dense word r * row_words + delta[i]
            delta = offsets - k_firsts * (rb // word)
            if not delta.any():
                delta = None
            slot = self._stage(k_firsts, k_starts, delta)
        fire = self._launcher.bind(
            self._region_words[word],
            dense[0].view(_WORD_DTYPES[word]),
            self._no_table if slot is None else slot.device,
            word=word,
            vec=vec,
            n_runs=len(k_starts),
            total_rows=k_rows,
            inline=inline,
            save=save,
            delta=delta is not None,
        )
        return slot, fire

    def _split(self, lengths: np.ndarray) -> tuple[Selection, Selection]:
        """(runs for the copy engines, runs for the kernel): each None, _ALL or a boolean mask.

        Long runs (>= dma_min_bytes) to the copy engines, short ones to the kernel, side by side;
        but small batches (FEW_RUNS, or MIXED_MIN_RUNS with a long run) to the copy engines alone.
        """
        n = len(lengths)
        big = self._big_rows
        if n == 0:
            return None, None
        if big is None:
            return None, _ALL
        if n <= FEW_RUNS:
            return _ALL, None
        long = lengths >= big
        n_long = int(np.count_nonzero(long))
        if n_long == n or (n_long and n <= MIXED_MIN_RUNS):
            return _ALL, None
        if n_long == 0:
            return None, _ALL
        return long, ~long

    def _stage(self, firsts: np.ndarray, starts: np.ndarray, delta: np.ndarray | None) -> _Slot:
        """Write the run table (first, start, delta columns) into a free slot's pinned buffer."""
        n = len(starts)
        slot = self._take_slot(n)
        table = slot.table
        table[:n] = firsts
        table[n : 2 * n] = starts
        table[2 * n : 3 * n] = 0 if delta is None else delta  # unused column kept: the layout is fixed
        slot.staged_bytes = 3 * n * 8
        return slot

    def _retire(self, batch: _Batch) -> None:
        seconds = self._rt.elapsed(batch.start, batch.end)
        self._timings.append(CopyTiming(batch.direction, tuple(batch.tickets), batch.nbytes, seconds))
        self._events.append((batch.start, batch.end))
        if batch.slot is not None:
            self._slots.append(batch.slot)

    def _take_slot(self, runs: int) -> _Slot:
        for i, slot in enumerate(self._slots):
            if slot.capacity >= runs:
                return self._slots.pop(i)
        return _Slot(max(1024, 1 << (runs - 1).bit_length()), self._device)

    def _warmup(self) -> None:
        """Compile the variants a 16-byte-aligned batch uses now, not on the engine's first step."""
        word, vec = _word(self._base_align | 16)
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


class _Owners:
    """Which payload each run of a save belongs to, and where each payload's allocation begins.

    A payload's storage begins at `data_ptr - storage_offset * itemsize`: views of one tensor share
    that address, separately allocated tensors (even adjacent ones) do not.
    """

    def __init__(self, runs: Runs, payloads: list[torch.Tensor]) -> None:
        self._runs = runs
        self._payloads = payloads

    @property
    def of_run(self) -> np.ndarray:
        return self._runs.per_run(np.arange(len(self._payloads)))

    def storage_bases(self) -> np.ndarray:
        count = len(self._payloads)
        pointers = np.fromiter(map(_data_ptr, self._payloads), np.int64, count)
        offsets = np.fromiter(map(_storage_offset, self._payloads), np.int64, count)
        return pointers - offsets * self._payloads[0].element_size()


_storage_offset = torch.Tensor.storage_offset


def _join_touching(
    starts: np.ndarray,
    lengths: np.ndarray,
    firsts: np.ndarray,
    at: np.ndarray,
    row_bytes: int,
    owners: _Owners | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Merge each run into the previous one where both the region blocks and the dense bytes continue it.

    Entries the allocator placed back to back (FIFO allocation makes many) then cost one copy-engine
    copy instead of one each: the driver spends ~1-1.5 µs of host time per copy of a batch. On the
    dense side a copy may not span two allocations, so with `owners` (saves: one payload per copy)
    runs of different payloads are joined only when the payloads are views of one tensor, as an
    encoder's per-item outputs split from its batch output are.
    """
    head = lengths[:-1]
    touching = starts[1:] == starts[:-1] + head  # region side first: most batches stop here
    if not touching.any():
        return starts, lengths, firsts, at
    touching &= at[1:] == at[:-1] + head * row_bytes
    if owners is not None and touching.any():
        of_run = owners.of_run
        across = touching & (of_run[1:] != of_run[:-1])
        if across.any():
            bases = owners.storage_bases()
            touching &= ~across | (bases[of_run[1:]] == bases[of_run[:-1]])
    if not touching.any():
        return starts, lengths, firsts, at
    heads = np.flatnonzero(np.concatenate(([True], ~touching)))
    return starts[heads], np.add.reduceat(lengths, heads), firsts[heads], at[heads]


def _word(align: int) -> tuple[int, int]:
    """(word bytes, words per 16-byte access) for addresses and sizes all multiples of `align`."""
    a = min(align & -align, 16) if align else 16
    word = min(a, 8)
    return word, a // word
