"""Entry table: lookup, FIFO eviction of ready+unpinned, fail-fast allocation, deadlines."""

from __future__ import annotations

import pytest

from ec_connector.domain.blocks import Extent, total_blocks
from ec_connector.domain.cache import EntryTable
from ec_connector.domain.entries import Phase
from ec_connector.domain.errors import IllegalTransition, UnknownEntry

LEASE = 30.0
Q = 60.0


def _table(num_blocks: int = 10) -> EntryTable:
    return EntryTable(num_blocks)


def _put_ready(table: EntryTable, key: str, rows: int, now: float = 0.0) -> None:
    res = table.reserve(key, rows, now=now, lease_s=LEASE)
    assert res is not None
    table.mark_ready(key)


def _keys(table: EntryTable) -> list[str]:
    return [e.key for e in table.entries()]


def test_reserve_adds_a_not_ready_entry_with_a_save_lease():
    table = _table()
    res = table.reserve("a", 3, now=5.0, lease_s=LEASE)
    assert res is not None
    assert res.evicted == ()
    assert res.entry.key == "a"
    assert res.entry.phase is Phase.NOT_READY
    assert res.entry.extents == (Extent(0, 3),)
    assert res.entry.ready_deadline == 35.0
    assert table.get("a") is res.entry
    assert "a" in table and len(table) == 1
    assert not table.is_ready("a")
    assert table.blocks.free_blocks == 7


def test_lookup_of_an_unknown_key_is_a_miss():
    table = _table()
    assert table.get("nope") is None
    assert "nope" not in table
    assert not table.is_ready("nope")


@pytest.mark.parametrize(
    "op",
    [
        lambda t: t.mark_ready("x"),
        lambda t: t.pin("x"),
        lambda t: t.unpin("x"),
        lambda t: t.grant("x", 1, now=0.0, lease_s=1.0),
        lambda t: t.announce("x", now=0.0, lease_s=1.0),
        lambda t: t.quarantine("x", now=0.0, quarantine_s=1.0),
        lambda t: t.drop("x"),
        lambda t: t.extend_ready_deadline("x", 9.0),
    ],
    ids=["mark_ready", "pin", "unpin", "grant", "announce", "quarantine", "drop", "extend"],
)
def test_operations_on_an_unknown_key_raise_unknown_entry(op):
    table = _table()
    with pytest.raises(UnknownEntry):
        op(table)
    assert len(table) == 0


def test_unknown_entry_is_a_key_error():
    assert issubclass(UnknownEntry, KeyError)


def test_release_grant_of_an_unknown_key_is_false():
    assert _table().release_grant("x", 1) is False


def test_reserve_of_a_key_already_held_is_illegal():
    table = _table()
    table.reserve("a", 2, now=0.0, lease_s=LEASE)
    with pytest.raises(IllegalTransition, match="entry 'a' is already held"):
        table.reserve("a", 2, now=0.0, lease_s=LEASE)
    assert len(table) == 1 and table.blocks.free_blocks == 8


@pytest.mark.parametrize("rows", [0, -2])
def test_reserve_of_no_rows_is_a_caller_error(rows):
    with pytest.raises(ValueError, match=f"cannot reserve {rows} rows"):
        _table().reserve("a", rows, now=0.0, lease_s=LEASE)


def test_ready_entries_are_evicted_oldest_first():
    table = _table(10)
    for key in ("a", "b", "c"):
        _put_ready(table, key, 3)
    res = table.reserve("d", 4, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["a"]
    res = table.reserve("e", 5, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["b", "c"]
    assert _keys(table) == ["d", "e"]
    assert table.blocks.free_blocks == 1


def test_eviction_stops_as_soon_as_the_allocation_fits():
    table = _table(10)
    for key in ("a", "b", "c", "d", "e"):
        _put_ready(table, key, 2)
    res = table.reserve("f", 3, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["a", "b"]
    assert _keys(table) == ["c", "d", "e", "f"]


# --- run floor -----------------------------------------------------------------------------------


def _slivered(min_run: int) -> EntryTable:
    """A full table of six 2-block entries a-f, b and d dropped: free [2,4) and [6,8)."""
    table = EntryTable(12, min_run=min_run)
    for key in "abcdef":
        _put_ready(table, key, 2)
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
    assert _keys(table) == ["c", "e", "f", "g"]


def test_space_evictions_are_not_counted_as_evictions_for_runs():
    table = _slivered(min_run=3)
    res = table.reserve("g", 6, now=1.0, lease_s=LEASE)  # 4 free: a is evicted for space
    assert res is not None
    assert [e.key for e in res.evicted] == ["a"] and res.for_runs == 0
    assert res.entry.extents == (Extent(0, 4), Extent(6, 2))  # pieces of 4, then the remainder


def test_a_run_floor_evicts_at_most_the_entrys_own_size_more_then_takes_short_runs():
    table = EntryTable(20, min_run=4)
    for key in "abcdefghij":  # b, d, f and h pinned: evicting a, e or g merges no free runs
        _put_ready(table, key, 2)
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
        _put_ready(table, key, 2)
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
    assert _keys(table) == ["e", "g", "i", "k", "x"]


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


def test_no_eviction_when_free_space_suffices():
    table = _table(10)
    _put_ready(table, "a", 3)
    res = table.reserve("b", 7, now=0.0, lease_s=LEASE)
    assert res is not None and res.evicted == ()
    assert _keys(table) == ["a", "b"]


def test_eviction_order_is_reservation_order_not_ready_order():
    table = _table(6)
    table.reserve("a", 3, now=0.0, lease_s=LEASE)
    table.reserve("b", 3, now=0.0, lease_s=LEASE)
    table.mark_ready("b")
    table.mark_ready("a")
    res = table.reserve("c", 3, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["a"]


def test_pinned_entry_is_never_evicted():
    table = _table(6)
    _put_ready(table, "a", 3)
    _put_ready(table, "b", 3)
    table.pin("a")
    res = table.reserve("c", 3, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["b"]
    assert "a" in table


def test_granted_entry_is_never_evicted():
    table = _table(6)
    _put_ready(table, "a", 3)
    _put_ready(table, "b", 3)
    table.grant("a", 1, now=0.0, lease_s=LEASE)
    res = table.reserve("c", 3, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["b"]


def test_not_ready_entry_is_never_evicted():
    table = _table(6)
    table.reserve("a", 3, now=0.0, lease_s=LEASE)
    _put_ready(table, "b", 3)
    res = table.reserve("c", 3, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["b"]


def test_quarantined_entry_is_never_evicted():
    table = _table(6)
    table.reserve("a", 3, now=0.0, lease_s=LEASE)
    table.quarantine("a", now=0.0, quarantine_s=Q)
    _put_ready(table, "b", 3)
    res = table.reserve("c", 3, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["b"]
    assert table.reserve("d", 3, now=1.0, lease_s=LEASE) is None


def test_announced_entry_is_not_evicted_while_the_announcement_lasts():
    table = _table(6)
    _put_ready(table, "a", 3)
    _put_ready(table, "b", 3)
    table.announce("a", now=0.0, lease_s=10.0)
    res = table.reserve("c", 3, now=9.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["b"]
    # at 10.0 the announcement has lapsed (even before expire runs): evictable again
    res = table.reserve("d", 3, now=10.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["a"]


def test_protected_entry_is_not_evicted():
    table = _table(6)
    _put_ready(table, "a", 3)
    _put_ready(table, "b", 3)
    res = table.reserve("c", 3, now=1.0, lease_s=LEASE, protect={"a"})
    assert res is not None
    assert [e.key for e in res.evicted] == ["b"]
    assert _keys(table) == ["a", "c"]


def test_allocation_that_fits_only_by_evicting_a_protected_entry_fails_and_evicts_nothing():
    table = _table(6)
    _put_ready(table, "a", 3)
    _put_ready(table, "b", 3)
    assert table.evictable_blocks(1.0, protect={"b"}) == 3
    assert not table.can_fit(4, 1.0, protect={"b"})
    assert table.can_fit(4, 1.0)
    assert table.reserve("c", 4, now=1.0, lease_s=LEASE, protect={"b"}) is None
    assert _keys(table) == ["a", "b"]
    assert table.blocks.free_blocks == 0


def test_allocation_that_cannot_fit_evicts_nothing():
    table = _table(10)
    _put_ready(table, "a", 3)
    _put_ready(table, "b", 3)
    table.reserve("c", 3, now=0.0, lease_s=LEASE)  # not ready: 1 free + 6 evictable = 7
    before = (_keys(table), table.blocks.free_extents())
    assert table.reserve("d", 8, now=1.0, lease_s=LEASE) is None
    assert (_keys(table), table.blocks.free_extents()) == before
    assert table.is_ready("a") and table.is_ready("b")


def test_allocation_larger_than_the_region_fails_at_once():
    table = _table(10)
    _put_ready(table, "a", 3)
    assert table.reserve("big", 11, now=0.0, lease_s=LEASE) is None
    assert _keys(table) == ["a"]


def test_allocation_that_fits_only_by_evicting_everything_evictable_succeeds():
    table = _table(10)
    _put_ready(table, "a", 3)
    table.reserve("b", 2, now=0.0, lease_s=LEASE)
    _put_ready(table, "c", 3)
    res = table.reserve("d", 8, now=0.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["a", "c"]
    assert res.entry.rows == 8
    assert table.blocks.free_blocks == 0


def test_can_fit_counts_free_and_evictable_blocks():
    table = _table(10)
    _put_ready(table, "a", 3)
    table.reserve("b", 3, now=0.0, lease_s=LEASE)
    assert table.evictable_blocks(0.0) == 3
    assert table.can_fit(7, now=0.0)
    assert not table.can_fit(8, now=0.0)


def test_evicted_entry_can_be_reserved_again_and_goes_to_the_back():
    table = _table(4)
    _put_ready(table, "a", 2)
    _put_ready(table, "b", 2)
    table.reserve("c", 2, now=1.0, lease_s=LEASE)  # evicts a
    assert "a" not in table
    res = table.reserve("a", 2, now=1.0, lease_s=LEASE)  # evicts b
    assert res is not None and [e.key for e in res.evicted] == ["b"]
    assert _keys(table) == ["c", "a"]


def test_unpin_makes_an_entry_evictable_again():
    table = _table(3)
    _put_ready(table, "a", 3)
    table.pin("a")
    assert table.reserve("b", 1, now=0.0, lease_s=LEASE) is None
    table.unpin("a")
    res = table.reserve("b", 1, now=0.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["a"]


def test_drop_frees_an_unpinned_entry():
    table = _table(10)
    table.reserve("a", 4, now=0.0, lease_s=LEASE)
    dropped = table.drop("a")
    assert dropped.key == "a"
    assert "a" not in table
    assert table.blocks.free_extents() == (Extent(0, 10),)


def test_drop_of_a_pinned_entry_is_illegal():
    table = _table(10)
    _put_ready(table, "a", 4)
    table.pin("a")
    with pytest.raises(IllegalTransition, match=r"entry 'a' is pinned \(1\); cannot drop"):
        table.drop("a")
    assert "a" in table and table.blocks.free_blocks == 6


def test_drop_of_a_granted_entry_is_illegal():
    table = _table(10)
    _put_ready(table, "a", 4)
    table.grant("a", 9, now=0.0, lease_s=5.0)
    with pytest.raises(IllegalTransition, match=r"entry 'a' is pinned \(1\)"):
        table.drop("a")


def test_drop_of_a_quarantined_entry_is_illegal():
    table = _table(10)
    table.reserve("a", 4, now=0.0, lease_s=LEASE)
    table.quarantine("a", now=0.0, quarantine_s=Q)
    with pytest.raises(IllegalTransition, match="entry 'a' is quarantined; it is freed when that ends"):
        table.drop("a")
    assert table.get("a").phase is Phase.QUARANTINED
    assert table.blocks.free_blocks == 6


def test_expire_with_nothing_due_settles_nothing():
    table = _table(10)
    table.reserve("a", 4, now=0.0, lease_s=LEASE)
    out = table.expire(29.9, quarantine_s=Q)
    assert not out
    assert table.get("a").phase is Phase.NOT_READY


def test_lapsed_save_lease_quarantines_then_frees_the_blocks():
    table = _table(10)
    table.reserve("a", 4, now=0.0, lease_s=LEASE)
    out = table.expire(30.0, quarantine_s=Q)
    assert out.save_lapsed == ["a"]
    entry = table.get("a")
    assert entry.phase is Phase.QUARANTINED
    assert entry.quarantined_until == 90.0
    assert table.blocks.free_blocks == 6
    assert not table.expire(89.0, quarantine_s=Q)
    out = table.expire(90.0, quarantine_s=Q)
    assert [e.key for e in out.quarantines_settled] == ["a"]
    assert "a" not in table
    assert table.blocks.free_extents() == (Extent(0, 10),)


def test_quarantine_is_measured_from_the_expire_time():
    table = _table(10)
    table.reserve("a", 4, now=0.0, lease_s=LEASE)
    table.expire(45.0, quarantine_s=Q)
    assert table.get("a").quarantined_until == 105.0


def test_ready_entry_save_lease_never_lapses():
    table = _table(10)
    _put_ready(table, "a", 4)
    out = table.expire(1000.0, quarantine_s=Q)
    assert out.save_lapsed == []
    assert table.is_ready("a")


def test_extended_save_lease_lapses_only_at_the_new_deadline():
    table = _table(10)
    table.reserve("a", 4, now=0.0, lease_s=LEASE)
    table.extend_ready_deadline("a", 50.0)
    assert not table.expire(40.0, quarantine_s=Q)
    assert table.get("a").phase is Phase.NOT_READY
    out = table.expire(50.0, quarantine_s=Q)
    assert out.save_lapsed == ["a"]


def test_explicit_quarantine_frees_blocks_when_it_ends():
    table = _table(10)
    table.reserve("a", 4, now=0.0, lease_s=LEASE)
    entry = table.quarantine("a", now=1.0, quarantine_s=20.0)
    assert entry.quarantined_until == 21.0
    out = table.expire(30.0, quarantine_s=Q)
    assert out.save_lapsed == []  # the quarantined entry's save lease no longer matters
    assert [e.key for e in out.quarantines_settled] == ["a"]
    assert table.blocks.free_blocks == 10


def test_lapsed_grant_is_released():
    table = _table(10)
    _put_ready(table, "a", 4)
    table.grant("a", 3, now=0.0, lease_s=30.0)
    table.grant("a", 4, now=10.0, lease_s=30.0)
    out = table.expire(30.0, quarantine_s=Q)
    assert out.grants_released == [("a", 3)]
    assert table.get("a").grants == {4: 40.0}
    out = table.expire(40.0, quarantine_s=Q)
    assert out.grants_released == [("a", 4)]
    assert table.get("a").pin_count == 0


def test_grant_released_before_its_lease_is_not_reported_by_expire():
    table = _table(10)
    _put_ready(table, "a", 4)
    table.grant("a", 3, now=0.0, lease_s=30.0)
    assert table.release_grant("a", 3) is True
    assert table.release_grant("a", 3) is False
    assert not table.expire(31.0, quarantine_s=Q)


def test_reused_grant_id_lapses_at_its_own_deadline():
    table = _table(10)
    _put_ready(table, "a", 4)
    table.grant("a", 3, now=0.0, lease_s=10.0)
    table.release_grant("a", 3)
    table.grant("a", 3, now=5.0, lease_s=10.0)
    assert not table.expire(10.0, quarantine_s=Q)
    assert table.get("a").grants == {3: 15.0}
    assert table.expire(15.0, quarantine_s=Q).grants_released == [("a", 3)]


def test_announcement_end_is_reported_once():
    table = _table(10)
    _put_ready(table, "a", 4)
    table.announce("a", now=0.0, lease_s=60.0)
    table.announce("a", now=0.0, lease_s=60.0)
    assert not table.expire(59.0, quarantine_s=Q)
    out = table.expire(60.0, quarantine_s=Q)
    assert out.announcements_ended == ["a"]
    assert table.get("a").is_evictable(60.0)
    assert not table.expire(200.0, quarantine_s=Q)


def test_extended_announcement_is_reported_at_its_latest_end():
    table = _table(10)
    _put_ready(table, "a", 4)
    table.announce("a", now=0.0, lease_s=60.0)
    table.announce("a", now=30.0, lease_s=60.0)
    assert not table.expire(60.0, quarantine_s=Q)
    assert table.expire(90.0, quarantine_s=Q).announcements_ended == ["a"]


def test_released_grant_ends_the_announcement():
    table = _table(10)
    _put_ready(table, "a", 4)
    table.announce("a", now=0.0, lease_s=60.0)
    table.grant("a", 1, now=0.0, lease_s=30.0)
    table.release_grant("a", 1)
    assert table.get("a").is_evictable(1.0)
    assert table.evictable_blocks(1.0) == 4


def test_deadlines_of_a_freed_entry_do_not_touch_a_new_entry_with_the_same_key():
    table = _table(10)
    table.reserve("a", 4, now=0.0, lease_s=10.0)
    table.drop("a")
    table.reserve("a", 4, now=5.0, lease_s=10.0)
    assert not table.expire(10.0, quarantine_s=Q)
    assert table.get("a").phase is Phase.NOT_READY
    assert table.expire(15.0, quarantine_s=Q).save_lapsed == ["a"]


def test_expiry_is_falsy_only_when_empty():
    table = _table(10)
    _put_ready(table, "a", 4)
    table.grant("a", 1, now=0.0, lease_s=1.0)
    assert table.expire(1.0, quarantine_s=Q)


def test_a_reservation_at_an_earlier_time_than_one_already_seen_respects_the_announcement():
    table = _table(9)
    _put_ready(table, "a", 3)
    _put_ready(table, "b", 3)
    table.announce("a", now=0.0, lease_s=10.0)
    assert table.evictable_blocks(12.0) == 6  # a's announcement has ended by 12.0
    # asked again about 5.0 (a caller's clock is not the table's concern): a is announced then
    assert table.evictable_blocks(5.0) == 3
    assert not table.can_fit(7, now=5.0)
    assert table.reserve("c", 7, now=5.0, lease_s=LEASE) is None
    assert _keys(table) == ["a", "b"]
    res = table.reserve("c", 6, now=5.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["b"]
    assert table.get("a").is_announced(5.0)


def test_protect_may_be_any_container_of_keys():
    for protect in (["b", "b"], ("b",), {"b": 1}.keys(), {"b", "x", "y", "z", "w"}):
        table = _table(9)
        _put_ready(table, "a", 3)
        _put_ready(table, "b", 3)
        _put_ready(table, "c", 3)
        assert table.evictable_blocks(1.0, protect=protect) == 6, protect
        assert table.reserve("d", 7, now=1.0, lease_s=LEASE, protect=protect) is None
        res = table.reserve("d", 6, now=1.0, lease_s=LEASE, protect=protect)
        assert res is not None and [e.key for e in res.evicted] == ["a", "c"], protect
        assert _keys(table) == ["b", "d"]


def test_an_entry_read_goes_to_the_back_of_the_queue_once_its_last_pin_is_released():
    table = _table(9)
    for key in "abc":
        _put_ready(table, key, 3)
    table.pin("a")
    table.pin("a")  # two loads of "a" in flight
    table.unpin("a")
    table.pin("b")
    table.unpin("b")  # "b" read: behind "c" now; "a" still held
    res = table.reserve("d", 3, now=1.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["c"]
    table.unpin("a")  # its last pin: behind "b" and "d"
    table.mark_ready("d")
    res = table.reserve("e", 6, now=1.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["b", "d"]
    assert _keys(table) == ["a", "e"]


def test_an_entry_a_peer_read_goes_to_the_back_of_the_queue_once_its_last_grant_is_released():
    table = _table(6)
    _put_ready(table, "a", 3)
    _put_ready(table, "b", 3)
    table.grant("a", 1, now=0.0, lease_s=30.0)
    table.pin("a")
    assert table.release_grant("a", 1) is True  # still pinned: its place is decided at the unpin
    table.unpin("a")
    res = table.reserve("c", 3, now=1.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["b"]
    table.grant("a", 2, now=1.0, lease_s=1.0)  # a grant that lapses counts as released
    table.mark_ready("c")
    table.expire(2.0, quarantine_s=Q)
    res = table.reserve("d", 3, now=2.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["c"]


def test_an_entry_pinned_and_unpinned_many_times_keeps_one_place_in_the_queue():
    table = _table(6)
    _put_ready(table, "a", 3)
    _put_ready(table, "b", 3)
    for _ in range(200):  # each unpin queues "a" again, behind "b"
        table.pin("a")
        table.unpin("a")
    table.pin("b")
    table.unpin("b")  # now "b" is behind "a"
    res = table.reserve("c", 3, now=1.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["a"]
    assert table._policy.queued() <= 64, "the re-queued entry's stale places are dropped"


def test_metadata_stays_proportional_to_live_entries_and_deadlines():
    # A long run of saves whose leases never lapse within it (the cache-comparison trace's shape):
    # every save lease leaves a deadline behind once the entry is ready or evicted.
    table = _table(64)
    now = 0.0
    for i in range(5000):
        now += 0.02
        table.expire(now, quarantine_s=Q)
        key = f"k{i}"
        assert table.reserve(key, 1 + i % 7, now=now, lease_s=LEASE) is not None
        table.mark_ready(key)
        table.announce(key, now=now, lease_s=0.1)
        if i % 3 == 0:
            table.pin(key)
            table.unpin(key)
    live = len(table)
    assert live <= 64
    # stale heap items are dropped once they outnumber the live ones
    assert len(table._deadlines) <= 2 * live + 64
    assert table._policy.queued() <= 2 * live + 64
    assert len(table._held) <= 2 * live + 64
    assert table.evictable_blocks(now + 1.0) == table.blocks.used_blocks


def test_a_reservation_at_an_earlier_time_evicts_in_the_same_queue_order():
    table = _table(6)
    _put_ready(table, "a", 3)
    _put_ready(table, "b", 3)
    table.pin("a")
    table.unpin("a")  # queued again, behind b
    assert table.evictable_blocks(10.0) == 6
    res = table.reserve("c", 3, now=5.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["b"]
