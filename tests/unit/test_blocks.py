"""Extent allocator: contiguous runs first, maximal free extents, loud corruption."""

from __future__ import annotations

import pytest

from ec_connector.domain.blocks import Extent, ExtentAllocator, coalesce, total_blocks
from ec_connector.domain.errors import AllocatorCorruption


def test_extent_is_a_half_open_run_of_blocks():
    ext = Extent(3, 4)
    assert ext.end == 7
    assert total_blocks((Extent(0, 2), Extent(5, 3))) == 5
    assert total_blocks(()) == 0


@pytest.mark.parametrize(("start", "length"), [(-1, 2), (0, 0), (4, -1)])
def test_extent_rejects_negative_start_or_empty_length(start, length):
    with pytest.raises(ValueError, match="extent must have start >= 0 and length > 0"):
        Extent(start, length)


def test_coalesce_sorts_and_merges_touching_extents_only():
    got = coalesce([Extent(5, 2), Extent(0, 2), Extent(2, 1), Extent(8, 1)])
    assert got == (Extent(0, 3), Extent(5, 2), Extent(8, 1))
    assert coalesce([]) == ()


def test_new_allocator_is_one_free_extent_covering_the_region():
    alloc = ExtentAllocator(10)
    assert alloc.free_extents() == (Extent(0, 10),)
    assert (alloc.free_blocks, alloc.used_blocks) == (10, 0)


@pytest.mark.parametrize("num_blocks", [0, -3])
def test_allocator_needs_at_least_one_block(num_blocks):
    with pytest.raises(ValueError, match=f"num_blocks must be > 0, got {num_blocks}"):
        ExtentAllocator(num_blocks)


def test_allocation_in_an_empty_region_is_one_run_from_block_zero():
    alloc = ExtentAllocator(10)
    assert alloc.allocate(4) == (Extent(0, 4),)
    assert alloc.free_extents() == (Extent(4, 6),)
    assert (alloc.free_blocks, alloc.used_blocks) == (6, 4)


@pytest.mark.parametrize("blocks", [0, -1])
def test_allocating_zero_or_negative_blocks_is_a_caller_error(blocks):
    alloc = ExtentAllocator(4)
    with pytest.raises(ValueError, match=f"cannot allocate {blocks} blocks"):
        alloc.allocate(blocks)
    assert alloc.free_extents() == (Extent(0, 4),)


def test_allocation_that_does_not_fit_returns_none_and_takes_nothing():
    alloc = ExtentAllocator(8)
    alloc.allocate(5)
    before = alloc.free_extents()
    assert alloc.allocate(4) is None
    assert alloc.free_extents() == before
    assert alloc.free_blocks == 3


def test_can_allocate_counts_free_blocks_not_runs():
    alloc = ExtentAllocator(6)
    a = alloc.allocate(2)
    alloc.allocate(2)
    alloc.release(a)  # free: [0,2) and [4,6), no run of 4
    assert alloc.can_allocate(4)
    assert not alloc.can_allocate(5)
    assert not alloc.can_allocate(0)


def _fragmented() -> tuple[ExtentAllocator, dict[str, tuple[Extent, ...]]]:
    """Free extents of lengths 3, 1, 2 at [0,3), [5,6), [8,10), in a region of 12."""
    alloc = ExtentAllocator(12)
    parts = {
        name: alloc.allocate(n) for name, n in [("a", 3), ("b", 2), ("c", 1), ("d", 2), ("e", 2), ("f", 2)]
    }
    assert parts["a"] == (Extent(0, 3),)
    assert parts["f"] == (Extent(10, 2),)
    for name in ("a", "c", "e"):
        alloc.release(parts[name])
    assert alloc.free_extents() == (Extent(0, 3), Extent(5, 1), Extent(8, 2))
    return alloc, parts


def test_allocation_uses_the_smallest_free_extent_that_fits():
    alloc, _ = _fragmented()
    assert alloc.allocate(2) == (Extent(8, 2),)
    assert alloc.free_extents() == (Extent(0, 3), Extent(5, 1))


def test_allocation_takes_one_run_whenever_an_extent_is_large_enough():
    alloc, _ = _fragmented()
    assert alloc.allocate(3) == (Extent(0, 3),)


def test_allocation_that_fits_no_single_extent_takes_largest_runs_first():
    alloc, _ = _fragmented()
    # 5 blocks: the largest (3) then a best fit of the remaining 2 -> two runs, not three.
    assert alloc.allocate(5) == (Extent(0, 3), Extent(8, 2))
    assert alloc.free_extents() == (Extent(5, 1),)
    assert alloc.free_blocks == 1


def test_allocation_of_every_free_block_takes_every_extent():
    alloc, _ = _fragmented()
    assert alloc.allocate(6) == (Extent(0, 3), Extent(5, 1), Extent(8, 2))
    assert alloc.free_extents() == ()
    assert alloc.free_blocks == 0
    assert alloc.allocate(1) is None


# --- run floor (free extents of lengths 3, 1, 2) ---------------------------------------------------


def test_a_run_floor_takes_a_short_extent_only_for_the_remainder():
    alloc, _ = _fragmented()
    # 4 blocks at a floor of 3: the 3 then 1 more, best-fit from the 1-block sliver.
    assert alloc.allocate(4, min_run=3) == (Extent(0, 3), Extent(5, 1))
    assert alloc.free_extents() == (Extent(8, 2),)


def test_a_run_floor_refuses_a_split_through_two_short_extents_and_takes_nothing():
    alloc, _ = _fragmented()
    before = alloc.free_extents()
    assert alloc.allocate(6, min_run=3) is None  # 3 + 2 + 1: the 2 is short and not the remainder
    assert alloc.allocate(5, min_run=4) is None  # no extent reaches 4, and 5 needs a split
    assert alloc.free_extents() == before and alloc.free_blocks == 6
    assert alloc.allocate(6) == (Extent(0, 3), Extent(5, 1), Extent(8, 2))  # no floor: every sliver


def test_a_run_floor_never_refuses_an_entry_that_one_free_extent_holds():
    alloc, _ = _fragmented()
    assert alloc.allocate(1, min_run=16) == (Extent(5, 1),)
    assert alloc.allocate(3, min_run=16) == (Extent(0, 3),)


@pytest.mark.parametrize("min_run", [0, -2])
def test_a_run_floor_below_one_block_is_a_caller_error(min_run):
    with pytest.raises(ValueError, match=f"min_run must be >= 1, got {min_run}"):
        ExtentAllocator(4).allocate(2, min_run=min_run)


def test_release_merges_with_both_free_neighbours():
    alloc = ExtentAllocator(9)
    a, b, c = alloc.allocate(3), alloc.allocate(3), alloc.allocate(3)
    alloc.release(a)
    alloc.release(c)
    assert alloc.free_extents() == (Extent(0, 3), Extent(6, 3))
    alloc.release(b)
    assert alloc.free_extents() == (Extent(0, 9),)
    assert alloc.free_blocks == 9


def test_release_merges_with_left_neighbour_only():
    alloc = ExtentAllocator(9)
    a, b, _c = alloc.allocate(3), alloc.allocate(3), alloc.allocate(3)
    alloc.release(a)
    alloc.release(b)
    assert alloc.free_extents() == (Extent(0, 6),)


def test_release_merges_with_right_neighbour_only():
    alloc = ExtentAllocator(9)
    _a, b, c = alloc.allocate(3), alloc.allocate(3), alloc.allocate(3)
    alloc.release(c)
    alloc.release(b)
    assert alloc.free_extents() == (Extent(3, 6),)


def test_release_of_a_multi_run_allocation_restores_the_region():
    alloc, parts = _fragmented()
    big = alloc.allocate(6)
    for name in ("b", "d", "f"):
        alloc.release(parts[name])
    alloc.release(big)
    assert alloc.free_extents() == (Extent(0, 12),)
    assert alloc.free_blocks == 12


def test_double_free_raises_allocator_corruption():
    alloc = ExtentAllocator(8)
    a = alloc.allocate(3)
    alloc.release(a)
    with pytest.raises(AllocatorCorruption, match="double free"):
        alloc.release(a)
    assert alloc.free_extents() == (Extent(0, 8),)
    assert alloc.free_blocks == 8


def test_release_overlapping_the_start_of_a_free_extent_raises():
    alloc = ExtentAllocator(8)
    alloc.allocate(4)  # free: [4, 8)
    with pytest.raises(AllocatorCorruption, match="overlaps free extent at 4: double free"):
        alloc.release((Extent(2, 4),))
    assert alloc.free_blocks == 4


def test_release_overlapping_the_tail_of_a_free_extent_raises():
    alloc = ExtentAllocator(8)
    a = alloc.allocate(4)
    alloc.allocate(4)
    alloc.release(a)  # free: [0, 4)
    with pytest.raises(AllocatorCorruption, match="overlaps free extent at 0: double free"):
        alloc.release((Extent(3, 2),))
    assert alloc.free_extents() == (Extent(0, 4),)


def test_release_covering_a_whole_free_extent_raises():
    alloc = ExtentAllocator(10)
    alloc.allocate(3)
    b = alloc.allocate(2)
    alloc.allocate(5)
    alloc.release(b)  # free: [3, 5)
    with pytest.raises(AllocatorCorruption, match="overlaps free extent at 3"):
        alloc.release((Extent(1, 6),))


def test_release_outside_the_region_raises_allocator_corruption():
    alloc = ExtentAllocator(8)
    alloc.allocate(8)
    with pytest.raises(AllocatorCorruption, match="lies outside the region of 8 blocks"):
        alloc.release((Extent(6, 3),))
    with pytest.raises(AllocatorCorruption, match="lies outside the region of 8 blocks"):
        alloc.release((Extent(8, 1),))
    assert alloc.free_blocks == 0
    assert alloc.free_extents() == ()


def test_allocator_corruption_is_a_runtime_error():
    assert issubclass(AllocatorCorruption, RuntimeError)
