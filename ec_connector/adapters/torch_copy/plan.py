"""Validated batches for the CPU engine (the flat table of region runs it copies), and batch timings.

The table is built with a handful of numpy operations over the whole batch. The CUDA engine plans
its batches in compiled C instead (batchplan.c); both name a bad copy with `raise_for_extents`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
    """A validated batch: the region runs of every copy, in batch order (int64 arrays)."""

    tickets: list[int]
    rows: list[int]  # rows of each copy
    counts: np.ndarray  # runs of each copy
    starts: np.ndarray  # first region block of each run
    lengths: np.ndarray  # blocks of each run
    total_rows: int


def plan_runs(copies: Sequence[PlannedCopy], num_blocks: int) -> Runs:
    """Flatten the extents of `copies`; LayoutMismatch if any copy is outside the region or miscounted.

    Reads each copy's packed extents (`PlannedCopy.packed`) as one int64 buffer: no Python per run.
    """
    n_copies = len(copies)
    rows = [c.rows for c in copies]
    # (start, length) pairs -> two contiguous columns (numpy is 3-5x slower on strided views)
    starts, lengths = np.frombuffer(b"".join([c.packed for c in copies]), np.int64).reshape(-1, 2).T.copy()
    n = len(lengths)
    ends = np.cumsum(lengths)
    if n == n_copies:  # every copy has at least one run (PlannedCopy), so one each
        counts = None
        covered_ok = lengths.tolist() == rows  # one C-level list compare: cheaper than numpy here
    else:
        counts = np.fromiter([len(c.packed) >> 4 for c in copies], np.int64, n_copies)
        cover = np.concatenate(([0], ends))[np.cumsum(counts)]
        covered_ok = bool((cover == np.cumsum(rows)).all())
    if not covered_ok or (n and int((starts + lengths).max()) > num_blocks):
        raise_for_extents(copies, num_blocks)
    return Runs(
        tickets=[c.ticket for c in copies],
        rows=rows,
        counts=np.ones(n, np.int64) if counts is None else counts,
        starts=starts,
        lengths=lengths,
        total_rows=int(ends[-1]) if n else 0,
    )


def raise_for_extents(copies: Sequence[PlannedCopy], num_blocks: int) -> None:
    """Raise the LayoutMismatch that names the first copy whose extents are wrong for its rows or region."""
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
    raise LayoutMismatch(
        "the batch's packed extents do not match its copies' extents; build each PlannedCopy without "
        "`packed` or with pack_extents(extents)"
    )
