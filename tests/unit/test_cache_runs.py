"""Entry table: the run floor (evict more to keep an entry's runs long) and the run cap (at most
that many runs per entry)."""

from __future__ import annotations

import pytest

from ec_connector.domain.blocks import Extent, total_blocks
from ec_connector.domain.cache import EntryTable
from tests.unit.table_helpers import LEASE, keys_of, put_ready

# --- run floor -----------------------------------------------------------------------------------


def _slivered(min_run: int) -> EntryTable:
    """A full table of six 2-block entries a-f, b and d dropped: free [2,4) and [6,8)."""
    table = EntryTable(12, min_run=min_run)
    for key in "abcdef":
        put_ready(table, key, 2)
    table.drop("b")
    table.drop("d")
    assert table.blocks.free_extents() == (Extent(2, 2), Extent(6, 2))
    return table


def test_without_a_run_floor_a_new_entry_takes_the_slivers():
    table = _slivered(min_run=1)
    res = table.reserve("g", 4, now=1.0, lease_s=LEASE)
    assert res is not None
    assert res.evicted == () and res.for_runs == 0
    assert res.entry.extents == (Extent(2, 2), Extent(6, 2))


def test_a_run_floor_evicts_the_oldest_entry_more_to_keep_the_runs_long():
    table = _slivered(min_run=3)
    res = table.reserve("g", 4, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["a"]
    assert res.for_runs == 1  # evicted beyond the space needed
    assert res.entry.extents == (Extent(0, 4),)  # a's blocks merged with the sliver beside them
    assert keys_of(table) == ["c", "e", "f", "g"]


def test_space_evictions_are_not_counted_as_evictions_for_runs():
    table = _slivered(min_run=3)
    res = table.reserve("g", 6, now=1.0, lease_s=LEASE)  # 4 free: a is evicted for space
    assert res is not None
    assert [e.key for e in res.evicted] == ["a"] and res.for_runs == 0
    assert res.entry.extents == (Extent(0, 4), Extent(6, 2))  # pieces of 4, then the remainder


def test_a_run_floor_evicts_at_most_the_entrys_own_size_more_then_takes_short_runs():
    table = EntryTable(20, min_run=4)
    for key in "abcdefghij":  # b, d, f and h pinned: evicting a, e or g merges no free runs
        put_ready(table, key, 2)
    for key in "bdfh":
        table.pin(key)
    table.drop("c")  # free [4,6)
    res = table.reserve("x", 2, now=1.0, lease_s=LEASE)
    assert res is not None and res.evicted == ()  # one free extent holds it: no floor to keep
    table.drop("x")
    res = table.reserve("y", 4, now=1.0, lease_s=LEASE)
    assert res is not None
    # a for space; e and g (4 blocks, y's own size) for runs, in vain; i and j are spared
    assert [e.key for e in res.evicted] == ["a", "e", "g"] and res.for_runs == 2
    assert "i" in table and "j" in table
    assert total_blocks(res.entry.extents) == 4 and len(res.entry.extents) == 2
    assert table.blocks.free_blocks == 4


def test_a_run_floor_never_evicts_a_protected_entry():
    table = _slivered(min_run=3)
    res = table.reserve("g", 4, now=1.0, lease_s=LEASE, protect={"a", "c", "e", "f"})
    assert res is not None and res.evicted == ()
    assert res.entry.extents == (Extent(2, 2), Extent(6, 2))


# --- run cap -------------------------------------------------------------------------------------


def _slivered_wide(max_runs: int) -> EntryTable:
    """A full table of twelve 2-block entries a-l, every second one dropped: six free 2-block slivers."""
    table = EntryTable(24, max_runs=max_runs)
    for key in "abcdefghijkl":
        put_ready(table, key, 2)
    for key in "bdfhjl":
        table.drop(key)
    assert len(table.blocks.free_extents()) == 6
    return table


def test_without_a_run_cap_a_large_entry_takes_every_sliver_it_needs():
    res = _slivered_wide(max_runs=0).reserve("x", 8, now=1.0, lease_s=LEASE)
    assert res is not None and res.evicted == ()
    assert len(res.entry.extents) == 4


def test_a_run_cap_evicts_the_oldest_entries_more_until_the_entry_fits_in_that_many_runs():
    table = _slivered_wide(max_runs=2)
    res = table.reserve("x", 8, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["a", "c"]  # oldest first, each for runs
    assert res.for_runs == 2
    assert res.entry.extents == (Extent(0, 8),)  # a, c and the slivers beside them
    assert keys_of(table) == ["e", "g", "i", "k", "x"]


@pytest.mark.parametrize(
    ("min_run", "max_runs", "rows", "expected"),
    [(1, 0, 40, 1), (3, 0, 40, 3), (3, 4, 10, 3), (3, 4, 40, 10), (3, 4, 41, 11), (1, 2, 1, 1)],
)
def test_the_shortest_run_of_an_entry_is_the_floor_or_its_share_under_the_cap(
    min_run, max_runs, rows, expected
):
    assert EntryTable(64, min_run=min_run, max_runs=max_runs).min_run_for(rows) == expected


def test_a_negative_run_cap_is_refused():
    with pytest.raises(ValueError, match=r"max_runs must be >= 0 \(0: no cap\), got -1"):
        EntryTable(8, max_runs=-1)


def test_a_run_floor_below_one_block_is_refused():
    with pytest.raises(ValueError, match="min_run must be >= 1, got 0"):
        EntryTable(8, min_run=0)
