"""CUDA engine: one kernel per batch through the region's mapped pointer, on pooled streams.

Per batch, on the caller's thread: validate, stage the run table (3 int64 per run) in pinned
memory, then on a copy stream: wait for the caller's stream (a reused fence event), record the start
event, copy the table to the device, launch the copy kernel, record the end event. No per-row host
work, no host synchronisation. Sources stay referenced until the end event has fired; load outputs
are allocated on the caller's stream, marked as used by the copy stream, and the caller's stream
waits on the end event, so anything queued after `load` sees the bytes.
"""

from __future__ import annotations

import ctypes
from array import array
from dataclasses import dataclass
from itertools import accumulate

import torch

from ec_connector.adapters.torch_copy import hostmem
from ec_connector.adapters.torch_copy.cpu import release_view
from ec_connector.adapters.torch_copy.plan import CopyTiming, Runs
from ec_connector.domain.errors import RegionError
from ec_connector.ports.region import Region

_WORD_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class _Slot:
    """Pinned staging and device copy of one batch's run table; reused once that batch has ended."""

    def __init__(self, runs: int, device: torch.device) -> None:
        self.capacity = runs
        self.pinned = torch.empty(3 * runs, dtype=torch.int64, pin_memory=True)
        self.device = torch.empty(3 * runs, dtype=torch.int64, device=device)
        self.address = self.pinned.data_ptr()
        self.staged = 0


@dataclass(slots=True)
class _Batch:
    direction: str
    tickets: list[int]
    nbytes: int
    start: torch.cuda.Event
    end: torch.cuda.Event
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
    ) -> None:
        from ec_connector.adapters.torch_copy import kernels

        if streams < 1:
            raise ValueError(f"TorchCopier streams must be >= 1, got {streams}")
        self._kernels = kernels
        lay = region.layout
        self._device = device
        self._dtype = dtype
        self._width = lay.hidden_dim
        self._row_bytes = lay.block_size_bytes
        self._tile_bytes = tile_bytes
        self._num_warps = num_warps
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
        self._region_words: dict[int, torch.Tensor] = {}
        self._base_align = self._row_bytes | self._registration.device_address
        with torch.cuda.device(device):
            self._save_streams = [torch.cuda.Stream(device) for _ in range(streams)]
            self._load_streams = [torch.cuda.Stream(device) for _ in range(streams)]
            self._fence = torch.cuda.Event()
        self._turn = 0
        self._pending: list[_Batch] = []
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._slots: list[_Slot] = []
        self._timings: list[CopyTiming] = []
        self._no_table = torch.zeros(3, dtype=torch.int64, device=device)
        self._warmup()

    # -- the two directions -------------------------------------------------------------------

    def save(self, runs: Runs, payloads: list[torch.Tensor]) -> None:
        caller = torch.cuda.current_stream(self._device)
        sources = tuple(p if p.is_contiguous() else p.contiguous() for p in payloads)
        pointers = [p.data_ptr() for p in sources]
        align = self._base_align
        for ptr in pointers:
            align |= ptr
        word, vec = _word(align)
        dense = sources[0].view(_WORD_DTYPES[word])
        if len(sources) == 1 and len(runs.starts) <= self._kernels.INLINE_RUNS:
            slot = None
        else:
            row_words = self._row_bytes // word
            base = pointers[0]
            deltas: list[int] = []
            first = 0
            for ptr, rows, count in zip(pointers, runs.rows, runs.counts, strict=True):
                deltas += [(ptr - base) // word - first * row_words] * count
                first += rows
            slot = self._stage(runs, deltas)
        stream = self._next(self._save_streams)
        start, end = self._launch(caller, stream, slot, runs, dense, word, vec, save=True)
        self._track("save", runs, start, end, slot, sources)

    def load(self, runs: Runs) -> tuple[torch.Tensor, ...]:
        caller = torch.cuda.current_stream(self._device)
        out = torch.empty((runs.total_rows, self._width), dtype=self._dtype, device=self._device)
        word, vec = _word(self._base_align)
        slot = None if len(runs.starts) <= self._kernels.INLINE_RUNS else self._stage(runs, None)
        stream = self._next(self._load_streams)
        dense = out.view(_WORD_DTYPES[word])
        start, end = self._launch(caller, stream, slot, runs, dense, word, vec, save=False)
        out.record_stream(stream)
        caller.wait_event(end)
        self._track("load", runs, start, end, slot, ())
        return out.split(runs.rows)

    # -- completion ------------------------------------------------------------------------------

    def poll(self) -> list[int]:
        done: list[int] = []
        still: list[_Batch] = []
        for batch in self._pending:
            if batch.end.query():
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
            batch.end.synchronize()
            done += batch.tickets
        self._pending = []
        self._slots = []
        self._events = []
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

    def _stage(self, runs: Runs, deltas: list[int] | None) -> _Slot:
        """Write the run table into a free slot's pinned buffer (`staged` int64 values)."""
        slot = self._take_slot(len(runs.starts))
        table = array("q", accumulate(runs.lengths, initial=0))
        table.pop()
        table.extend(runs.starts)
        if deltas is not None:
            table.extend(deltas)
        address, count = table.buffer_info()
        ctypes.memmove(slot.address, address, count * table.itemsize)
        slot.staged = count
        return slot

    def _launch(
        self,
        caller: torch.cuda.Stream,
        stream: torch.cuda.Stream,
        slot: _Slot | None,
        runs: Runs,
        dense: torch.Tensor,
        word: int,
        vec: int,
        *,
        save: bool,
    ) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        """Queue fence wait, start event, table upload (unless inline), kernel, end event on `stream`."""
        start, end = self._events.pop() if self._events else _event_pair()
        row_words = self._row_bytes // word
        if slot is None:
            inline = self._kernels.inline_runs(runs.starts, runs.lengths, runs.total_rows)
            table = self._no_table
        else:
            inline = None
            table = slot.device
        self._fence.record(caller)
        stream.wait_event(self._fence)
        torch.cuda.set_stream(stream)
        try:
            start.record(stream)
            if slot is not None:
                slot.device[: slot.staged].copy_(slot.pinned[: slot.staged], non_blocking=True)
            self._kernels.copy_runs(
                self._words(word),
                dense,
                table,
                n_runs=len(runs.starts),
                total_rows=runs.total_rows,
                row_words=row_words,
                inline=inline,
                save=save,
                delta=save and slot is not None,
                vec=vec,
                block=self._kernels.tile(row_words, word, self._tile_bytes),
                num_warps=self._num_warps,
            )
            end.record(stream)
        finally:
            torch.cuda.set_stream(caller)
        return start, end

    def _track(
        self,
        direction: str,
        runs: Runs,
        start: torch.cuda.Event,
        end: torch.cuda.Event,
        slot: _Slot | None,
        keep: tuple[torch.Tensor, ...],
    ) -> None:
        nbytes = runs.total_rows * self._row_bytes
        self._pending.append(_Batch(direction, runs.tickets, nbytes, start, end, slot, keep))

    def _retire(self, batch: _Batch) -> None:
        seconds = batch.start.elapsed_time(batch.end) / 1e3
        self._timings.append(CopyTiming(batch.direction, tuple(batch.tickets), batch.nbytes, seconds))
        self._events.append((batch.start, batch.end))
        if batch.slot is not None:
            self._slots.append(batch.slot)

    def _take_slot(self, runs: int) -> _Slot:
        for i, slot in enumerate(self._slots):
            if slot.capacity >= runs:
                return self._slots.pop(i)
        return _Slot(max(1024, 1 << (runs - 1).bit_length()), self._device)

    def _words(self, word: int) -> torch.Tensor:
        view = self._region_words.get(word)
        if view is None:
            view = self._region_words[word] = self._region.view(_WORD_DTYPES[word])
        return view

    def _warmup(self) -> None:
        word, vec = _word(self._base_align | 16)
        row_words = self._row_bytes // word
        dense = torch.empty(16, dtype=_WORD_DTYPES[word], device=self._device)
        with torch.cuda.device(self._device):
            self._kernels.warmup(
                self._words(word),
                dense,
                self._no_table,
                row_words=row_words,
                vec=vec,
                block=self._kernels.tile(row_words, word, self._tile_bytes),
                num_warps=self._num_warps,
            )
            torch.cuda.current_stream(self._device).synchronize()


def _word(align: int) -> tuple[int, int]:
    """(word bytes, words per 16-byte access) for addresses and sizes all multiples of `align`."""
    a = min(align & -align, 16) if align else 16
    word = min(a, 8)
    return word, a // word


def _event_pair() -> tuple[torch.cuda.Event, torch.cuda.Event]:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
