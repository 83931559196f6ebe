"""Validated batches: the flat list of region runs that both engines copy, and batch timings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, pairwise
from operator import add, attrgetter

from ec_connector.domain.errors import LayoutMismatch
from ec_connector.domain.transfers import PlannedCopy


@dataclass(frozen=True, slots=True)
class CopyTiming:
    """How long one batch took: device time on CUDA (events), wall time on CPU."""

    direction: str  # "save" or "load"
    tickets: tuple[int, ...]
    nbytes: int
    seconds: float


@dataclass(slots=True)
class Runs:
    """A validated batch: the region runs of every copy, in batch order."""

    tickets: list[int]
    rows: list[int]  # rows of each copy
    counts: list[int]  # runs of each copy
    starts: list[int]  # first region block of each run
    lengths: list[int]  # blocks of each run
    total_rows: int


_start = attrgetter("start")
_length = attrgetter("length")


def plan_runs(copies: Sequence[PlannedCopy], num_blocks: int) -> Runs:
    """Flatten the extents of `copies`; LayoutMismatch if any copy is outside the region or miscounted.

    Written as a few C-level passes over the whole batch (no per-extent Python statements): it runs
    on the engine's step thread for every batch.
    """
    counts = [len(c.extents) for c in copies]
    extents = list(chain.from_iterable([c.extents for c in copies]))
    starts = list(map(_start, extents))
    lengths = list(map(_length, extents))
    rows = [c.rows for c in copies]
    ends = list(accumulate(lengths, initial=0))
    bounds = list(accumulate(counts, initial=0))
    if [ends[b] - ends[a] for a, b in pairwise(bounds)] != rows:
        _raise_for(copies, num_blocks)
    if starts and max(map(add, starts, lengths)) > num_blocks:
        _raise_for(copies, num_blocks)
    return Runs([c.ticket for c in copies], rows, counts, starts, lengths, ends[-1])


def _raise_for(copies: Sequence[PlannedCopy], num_blocks: int) -> None:
    for copy in copies:
        covered = sum(e.length for e in copy.extents)
        if covered != copy.rows:
            raise LayoutMismatch(
                f"entry {copy.key!r} has {copy.rows} rows but its extents cover {covered} blocks; "
                "plan the copy with extents covering exactly its rows"
            )
        if any(e.end > num_blocks for e in copy.extents):
            raise LayoutMismatch(
                f"entry {copy.key!r} has extents {copy.extents} beyond the region's {num_blocks} "
                "blocks; extents must come from this region's allocator"
            )
    raise AssertionError("plan_runs found a problem that _raise_for could not name")  # pragma: no cover
