"""Validated batches: the flat list of region runs that both engines copy, and batch timings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import add

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

    @property
    def total_rows(self) -> int:
        return sum(self.rows)


def plan_runs(copies: Sequence[PlannedCopy], num_blocks: int) -> Runs:
    """Flatten the extents of `copies`; LayoutMismatch if any copy is outside the region or miscounted."""
    runs = Runs([], [], [], [], [])
    for copy in copies:
        exts = copy.extents
        starts = [e.start for e in exts]
        lengths = [e.length for e in exts]
        covered = sum(lengths)
        if covered != copy.rows:
            raise LayoutMismatch(
                f"entry {copy.key!r} has {copy.rows} rows but its extents cover {covered} blocks; "
                "plan the copy with extents covering exactly its rows"
            )
        if starts and max(map(add, starts, lengths)) > num_blocks:
            raise LayoutMismatch(
                f"entry {copy.key!r} has extents {exts} beyond the region's {num_blocks} blocks; "
                "extents must come from this region's allocator"
            )
        runs.tickets.append(copy.ticket)
        runs.rows.append(copy.rows)
        runs.counts.append(len(exts))
        runs.starts += starts
        runs.lengths += lengths
    return runs
