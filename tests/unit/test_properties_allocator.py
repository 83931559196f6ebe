"""Property tests of the allocator: blocks are never double-owned and never lost, free extents stay
maximal, an allocation is one run whenever a free extent is large enough and otherwise the fewest runs
possible; a run floor takes pieces only from long free extents."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ec_connector.domain.blocks import Extent, ExtentAllocator
from ec_connector.domain.errors import AllocatorCorruption
from tests.unit.property_checks import SETTINGS, assert_maximal, blocks_of

# --- allocator ---------------------------------------------------------------------------------

alloc_ops = st.lists(
    st.one_of(
        st.tuples(st.just("allocate"), st.integers(1, 40)),
        st.tuples(st.just("release"), st.integers(0, 1000)),
    ),
    max_size=60,
)


@SETTINGS
@given(num_blocks=st.integers(1, 64), ops=alloc_ops)
def test_allocator_never_double_owns_or_loses_a_block(num_blocks, ops):
    alloc = ExtentAllocator(num_blocks)
    owned: list[tuple[Extent, ...]] = []
    for op, arg in ops:
        free_before = alloc.free_extents()
        if op == "allocate":
            got = alloc.allocate(arg)
            if arg > sum(e.length for e in free_before):
                assert got is None
                assert alloc.free_extents() == free_before
                continue
            assert got is not None
            assert sum(e.length for e in got) == arg
            assert list(got) == sorted(got)
            # every block handed out was free
            assert set(blocks_of(got)) <= set(blocks_of(free_before))
            sizes = sorted((e.length for e in free_before), reverse=True)
            fits = [e for e in free_before if e.length >= arg]
            if fits:
                # one run, taken from a smallest free extent that is large enough (best fit)
                assert len(got) == 1
                best = min(e.length for e in fits)
                host = [e for e in fits if e.start <= got[0].start and got[0].end <= e.end]
                assert len(host) == 1 and host[0].length == best
            else:
                # the fewest runs the free space allows
                fewest = next(k for k in range(1, len(sizes) + 1) if sum(sizes[:k]) >= arg)
                assert len(got) == fewest
            owned.append(got)
        elif owned:
            alloc.release(owned.pop(arg % len(owned)))
        owned_blocks = [b for ext in owned for b in blocks_of(ext)]
        free_blocks = blocks_of(alloc.free_extents())
        assert len(owned_blocks) == len(set(owned_blocks)), "a block is owned twice"
        assert sorted(owned_blocks + free_blocks) == list(range(num_blocks)), "a block was lost"
        assert alloc.free_blocks == len(free_blocks) == num_blocks - alloc.used_blocks
        assert_maximal(alloc.free_extents())


@st.composite
def _filled(draw, max_blocks: int = 64, max_size: int = 16, min_entries: int = 0, max_entries: int = 20):
    """An allocator of 1-`max_blocks` blocks and the allocations of a drawn list of sizes that fit."""
    alloc = ExtentAllocator(draw(st.integers(1, max_blocks)))
    sizes = draw(st.lists(st.integers(1, max_size), min_size=min_entries, max_size=max_entries))
    return alloc, [got for n in sizes if (got := alloc.allocate(n)) is not None]


def _free_out_of_order(alloc: ExtentAllocator, owned: list, data: st.DataObject) -> None:
    """Release some of `owned` in a drawn order, as out-of-order frees leave slivers."""
    for i in data.draw(st.lists(st.integers(0, 1000), max_size=len(owned))):
        if owned:
            alloc.release(owned.pop(i % len(owned)))


@SETTINGS
@given(filled=_filled(max_blocks=96, max_size=12, max_entries=24), data=st.data())
def test_a_run_floor_takes_pieces_only_from_long_free_extents_or_refuses(filled, data):
    alloc, owned = filled
    _free_out_of_order(alloc, owned, data)
    free_before = alloc.free_extents()
    if not free_before:
        return
    # sizes just past the sum of the k largest free extents: splits into k + 1 pieces
    lengths = sorted((e.length for e in free_before), reverse=True)
    past_sums = [sum(lengths[:k]) + 1 for k in range(1, len(lengths) + 1)]
    want = data.draw(st.one_of(st.integers(1, alloc.free_blocks + 1), st.sampled_from(past_sums)))
    # floors at and just above the free lengths: where an off-by-one would take a short piece
    min_run = data.draw(st.sampled_from(sorted({e.length + d for e in free_before for d in (0, 1)})))
    got = alloc.allocate(want, min_run=min_run)
    long_total = sum(e.length for e in free_before if e.length >= min_run)
    short_max = max((e.length for e in free_before if e.length < min_run), default=0)
    fits = long_total >= want or short_max >= want - long_total
    if not fits:
        assert got is None
        assert alloc.free_extents() == free_before
        return
    assert got is not None and sum(e.length for e in got) == want
    hosts = [next(f for f in free_before if f.start <= e.start and e.end <= f.end) for e in got]
    assert sum(h.length < min_run for h in hosts) <= 1, "more than the remainder came from a short extent"
    if any(f.length >= want for f in free_before):
        assert len(got) == 1


@SETTINGS
@given(filled=_filled(max_blocks=96, max_size=12, max_entries=24), data=st.data())
def test_a_floor_of_a_kth_of_the_entry_places_it_in_at_most_k_runs_or_refuses(filled, data):
    # the table's run cap (`EntryTable.min_run_for`) rests on this
    alloc, owned = filled
    _free_out_of_order(alloc, owned, data)
    if not alloc.free_blocks:
        return
    want = data.draw(st.integers(1, alloc.free_blocks))
    k = data.draw(st.integers(1, 6))
    free_before = alloc.free_extents()
    got = alloc.allocate(want, min_run=-(-want // k))
    if got is None:
        assert alloc.free_extents() == free_before
    else:
        assert sum(e.length for e in got) == want and len(got) <= k


@SETTINGS
@given(filled=_filled(), data=st.data())
def test_releasing_everything_restores_one_free_extent(filled, data):
    alloc, owned = filled
    order = data.draw(st.permutations(range(len(owned))))
    for i in order:
        alloc.release(owned[i])
    assert alloc.free_extents() == (Extent(0, alloc.num_blocks),)


@SETTINGS
@given(filled=_filled(min_entries=1, max_entries=12), data=st.data())
def test_double_free_or_out_of_range_release_raises_allocator_corruption(filled, data):
    alloc, owned = filled
    num_blocks = alloc.num_blocks
    free = alloc.free_extents()
    if free:
        # any extent overlapping a free block is a double free
        ext = data.draw(st.sampled_from(free))
        start = data.draw(st.integers(max(0, ext.start - 3), ext.end - 1))
        end = data.draw(st.integers(max(start + 1, ext.start + 1), min(num_blocks, ext.end + 3)))
        bad = Extent(start, end - start)
        try:
            alloc.release((bad,))
        except AllocatorCorruption:
            pass
        else:
            raise AssertionError(f"released {bad} overlapping free {ext} without complaint")
        assert alloc.free_extents() == free
    start = data.draw(st.integers(0, num_blocks + 4))
    length = data.draw(st.integers(max(1, num_blocks - start + 1), num_blocks + 8))
    try:
        alloc.release((Extent(start, length),))
    except AllocatorCorruption:
        pass
    else:
        raise AssertionError(f"released {Extent(start, length)} beyond {num_blocks} blocks")
    assert alloc.free_extents() == free
    for got in owned:
        alloc.release(got)
    assert alloc.free_extents() == (Extent(0, num_blocks),)
