"""Extent allocator over the block indices of a region.

Free space is a set of maximal free extents kept in two sorted lists (by start and by size), so the
metadata is O(free extents) = O(entries), never one object per block. An allocation takes one
contiguous extent when one is large enough (best fit); otherwise it takes the largest free extents
until the remainder fits in one, then best-fits that remainder, so an entry ends up in as few
contiguous runs as the free space allows.

A split allocation may be asked for a run floor (`min_run`): every piece but the remainder must then
come from a free extent of at least `min_run` blocks. Short runs copy slowly (each is a separate
copy, or a trip through a gather kernel), and a full cache that evicts exactly what it needs makes
them: the entry must take every free block, slivers included. With a floor the allocation refuses
instead, and the caller decides whether to make room (evict more) or accept short runs.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, insort
from dataclasses import dataclass
from itertools import chain

from ec_connector.domain.errors import AllocatorCorruption


@dataclass(frozen=True, slots=True, order=True)
class Extent:
    """A contiguous run of blocks `[start, start + length)`."""

    start: int
    length: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.length <= 0:
            raise ValueError(f"extent must have start >= 0 and length > 0, got {self!r}")

    @property
    def end(self) -> int:
        return self.start + self.length


def total_blocks(extents: tuple[Extent, ...]) -> int:
    """Number of blocks covered by `extents`."""
    return sum(e.length for e in extents)


def pack_extents(extents: tuple[Extent, ...]) -> bytes:
    """The extents as machine int64 pairs (start, length), in order: what the copier reads a batch from.

    An entry's extents never change, so its packed form is made once and carried by every copy of it:
    a worker then reads a whole batch's runs with one buffer view instead of an attribute per run.
    """
    return array("q", chain.from_iterable((e.start, e.length) for e in extents)).tobytes()


def coalesce(extents: list[Extent] | tuple[Extent, ...]) -> tuple[Extent, ...]:
    """Sort extents and merge the ones that touch, so each run is as long as possible."""
    merged: list[Extent] = []
    for ext in sorted(extents):
        if merged and merged[-1].end == ext.start:
            merged[-1] = Extent(merged[-1].start, merged[-1].length + ext.length)
        else:
            merged.append(ext)
    return tuple(merged)


class ExtentAllocator:
    """Hands out and takes back extents of a region of `num_blocks` blocks."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self._starts: list[int] = [0]
        self._length: dict[int, int] = {0: num_blocks}
        self._by_size: list[tuple[int, int]] = [(num_blocks, 0)]
        self._free = num_blocks

    @property
    def free_blocks(self) -> int:
        return self._free

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self._free

    def free_extents(self) -> tuple[Extent, ...]:
        """The maximal free extents, in address order."""
        return tuple(Extent(s, self._length[s]) for s in self._starts)

    def can_allocate(self, blocks: int) -> bool:
        return 0 < blocks <= self._free

    def allocate(self, blocks: int, *, min_run: int = 1) -> tuple[Extent, ...] | None:
        """Take `blocks` blocks in as few runs as possible; None (nothing taken) if they do not fit.

        With `min_run` > 1 a split allocation takes its pieces only from free extents of at least
        `min_run` blocks (the last piece, the remainder, may be shorter), and is None (nothing taken)
        when the free space cannot be split that way. One free extent that holds all `blocks` is
        always taken, whatever its length.
        """
        if blocks <= 0:
            raise ValueError(f"cannot allocate {blocks} blocks")
        if min_run <= 0:
            raise ValueError(f"min_run must be >= 1, got {min_run}")
        if blocks > self._free:
            return None
        by_size = self._by_size
        i = bisect_left(by_size, (blocks, -1))
        if i < len(by_size):
            # One free extent is large enough (the usual case): take the smallest such, in place.
            size, start = by_size[i]
            del by_size[i]
            del self._length[start]
            j = bisect_left(self._starts, start)
            if blocks < size:
                rest = start + blocks
                self._starts[j] = rest  # the rest keeps the taken extent's place in address order
                self._length[rest] = size - blocks
                insort(by_size, (size - blocks, rest))
            else:
                del self._starts[j]
            self._free -= blocks
            return (Extent(start, blocks),)
        if min_run > 1 and not self._splits(blocks, min_run):
            return None
        taken: list[Extent] = []
        remaining = blocks
        while remaining:
            i = bisect_left(self._by_size, (remaining, -1))
            if i < len(self._by_size):
                size, start = self._by_size[i]
                taken.append(self._take(start, size, remaining))
                remaining = 0
            else:
                size, start = self._by_size[-1]
                taken.append(self._take(start, size, size))
                remaining -= size
        return tuple(sorted(taken))

    def _splits(self, blocks: int, min_run: int) -> bool:
        """Whether the split in `allocate` (largest extents first, then a best-fit remainder) takes
        no piece but the remainder from an extent shorter than `min_run`."""
        remaining = blocks
        for size, _ in reversed(self._by_size):
            if size >= remaining:
                return True
            if size < min_run:
                return False
            remaining -= size
        return False

    def release(self, extents: tuple[Extent, ...]) -> None:
        """Give extents back, merging with free neighbours. Raises on double free or out of range."""
        for ext in extents:
            self._release_one(ext)

    def _take(self, start: int, size: int, want: int) -> Extent:
        self._remove(start, size)
        if want < size:
            self._add(start + want, size - want)
        self._free -= want
        return Extent(start, want)

    def _release_one(self, ext: Extent) -> None:
        if ext.end > self.num_blocks:
            raise AllocatorCorruption(f"{ext} lies outside the region of {self.num_blocks} blocks")
        i = bisect_left(self._starts, ext.start)
        prev_start = self._starts[i - 1] if i > 0 else None
        next_start = self._starts[i] if i < len(self._starts) else None
        if prev_start is not None and prev_start + self._length[prev_start] > ext.start:
            raise AllocatorCorruption(f"{ext} overlaps free extent at {prev_start}: double free")
        if next_start is not None and next_start < ext.end:
            raise AllocatorCorruption(f"{ext} overlaps free extent at {next_start}: double free")
        start, length = ext.start, ext.length
        if prev_start is not None and prev_start + self._length[prev_start] == start:
            plen = self._length[prev_start]
            self._remove(prev_start, plen)
            start, length = prev_start, plen + length
        if next_start is not None and next_start == ext.end:
            nlen = self._length[next_start]
            self._remove(next_start, nlen)
            length += nlen
        self._add(start, length)
        self._free += ext.length

    def _add(self, start: int, length: int) -> None:
        insort(self._starts, start)
        self._length[start] = length
        insort(self._by_size, (length, start))

    def _remove(self, start: int, length: int) -> None:
        del self._starts[bisect_left(self._starts, start)]
        del self._length[start]
        del self._by_size[bisect_left(self._by_size, (length, start))]
