"""Entry table: FIFO eviction of ready, unpinned, unannounced, unprotected entries; fail-fast
allocation that evicts nothing when it cannot fit; an entry read goes to the back of the queue."""

from __future__ import annotations

import pytest

from tests.unit.table_helpers import LEASE, Q, keys_of, put_ready, table_of


def test_ready_entries_are_evicted_oldest_first():
    table = table_of(10)
    for key in ("a", "b", "c"):
        put_ready(table, key, 3)
    res = table.reserve("d", 4, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["a"]
    res = table.reserve("e", 5, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["b", "c"]
    assert keys_of(table) == ["d", "e"]
    assert table.blocks.free_blocks == 1


def test_eviction_stops_as_soon_as_the_allocation_fits():
    table = table_of(10)
    for key in ("a", "b", "c", "d", "e"):
        put_ready(table, key, 2)
    res = table.reserve("f", 3, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["a", "b"]
    assert keys_of(table) == ["c", "d", "e", "f"]


def test_no_eviction_when_free_space_suffices():
    table = table_of(10)
    put_ready(table, "a", 3)
    res = table.reserve("b", 7, now=0.0, lease_s=LEASE)
    assert res is not None and res.evicted == ()
    assert keys_of(table) == ["a", "b"]


def test_eviction_order_is_reservation_order_not_ready_order():
    table = table_of(6)
    table.reserve("a", 3, now=0.0, lease_s=LEASE)
    table.reserve("b", 3, now=0.0, lease_s=LEASE)
    table.mark_ready("b")
    table.mark_ready("a")
    res = table.reserve("c", 3, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["a"]


def test_pinned_entry_is_never_evicted():
    table = table_of(6)
    put_ready(table, "a", 3)
    put_ready(table, "b", 3)
    table.pin("a")
    res = table.reserve("c", 3, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["b"]
    assert "a" in table


def test_granted_entry_is_never_evicted():
    table = table_of(6)
    put_ready(table, "a", 3)
    put_ready(table, "b", 3)
    table.grant("a", 1, now=0.0, lease_s=LEASE)
    res = table.reserve("c", 3, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["b"]


def test_not_ready_entry_is_never_evicted():
    table = table_of(6)
    table.reserve("a", 3, now=0.0, lease_s=LEASE)
    put_ready(table, "b", 3)
    res = table.reserve("c", 3, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["b"]


def test_quarantined_entry_is_never_evicted():
    table = table_of(6)
    table.reserve("a", 3, now=0.0, lease_s=LEASE)
    table.quarantine("a", now=0.0, quarantine_s=Q)
    put_ready(table, "b", 3)
    res = table.reserve("c", 3, now=1.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["b"]
    assert table.reserve("d", 3, now=1.0, lease_s=LEASE) is None


def test_announced_entry_is_not_evicted_while_the_announcement_lasts():
    table = table_of(6)
    put_ready(table, "a", 3)
    put_ready(table, "b", 3)
    table.announce("a", now=0.0, lease_s=10.0)
    res = table.reserve("c", 3, now=9.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["b"]
    # at 10.0 the announcement has lapsed (even before expire runs): evictable again
    res = table.reserve("d", 3, now=10.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["a"]


def test_an_announcement_of_no_lease_holds_nothing_and_a_negative_one_is_refused():
    table = table_of(6)
    put_ready(table, "a", 3)
    put_ready(table, "b", 3)
    assert table.announce("a", now=0.0, lease_s=0.0).key == "a"
    res = table.reserve("c", 3, now=0.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["a"]  # still first in the order
    with pytest.raises(ValueError, match="lease_s must be >= 0, got -1"):
        table.announce("b", now=0.0, lease_s=-1.0)


def test_protected_entry_is_not_evicted():
    table = table_of(6)
    put_ready(table, "a", 3)
    put_ready(table, "b", 3)
    res = table.reserve("c", 3, now=1.0, lease_s=LEASE, protect={"a"})
    assert res is not None
    assert [e.key for e in res.evicted] == ["b"]
    assert keys_of(table) == ["a", "c"]


def test_allocation_that_fits_only_by_evicting_a_protected_entry_fails_and_evicts_nothing():
    table = table_of(6)
    put_ready(table, "a", 3)
    put_ready(table, "b", 3)
    assert table.evictable_blocks(1.0, protect={"b"}) == 3
    assert not table.can_fit(4, 1.0, protect={"b"})
    assert table.can_fit(4, 1.0)
    assert table.reserve("c", 4, now=1.0, lease_s=LEASE, protect={"b"}) is None
    assert keys_of(table) == ["a", "b"]
    assert table.blocks.free_blocks == 0


def test_allocation_that_cannot_fit_evicts_nothing():
    table = table_of(10)
    put_ready(table, "a", 3)
    put_ready(table, "b", 3)
    table.reserve("c", 3, now=0.0, lease_s=LEASE)  # not ready: 1 free + 6 evictable = 7
    before = (keys_of(table), table.blocks.free_extents())
    assert table.reserve("d", 8, now=1.0, lease_s=LEASE) is None
    assert (keys_of(table), table.blocks.free_extents()) == before
    assert table.is_ready("a") and table.is_ready("b")


def test_allocation_larger_than_the_region_fails_at_once():
    table = table_of(10)
    put_ready(table, "a", 3)
    assert table.reserve("big", 11, now=0.0, lease_s=LEASE) is None
    assert keys_of(table) == ["a"]


def test_allocation_that_fits_only_by_evicting_everything_evictable_succeeds():
    table = table_of(10)
    put_ready(table, "a", 3)
    table.reserve("b", 2, now=0.0, lease_s=LEASE)
    put_ready(table, "c", 3)
    res = table.reserve("d", 8, now=0.0, lease_s=LEASE)
    assert res is not None
    assert [e.key for e in res.evicted] == ["a", "c"]
    assert res.entry.rows == 8
    assert table.blocks.free_blocks == 0


def test_can_fit_counts_free_and_evictable_blocks():
    table = table_of(10)
    put_ready(table, "a", 3)
    table.reserve("b", 3, now=0.0, lease_s=LEASE)
    assert table.evictable_blocks(0.0) == 3
    assert table.can_fit(7, now=0.0)
    assert not table.can_fit(8, now=0.0)


def test_evicted_entry_can_be_reserved_again_and_goes_to_the_back():
    table = table_of(4)
    put_ready(table, "a", 2)
    put_ready(table, "b", 2)
    table.reserve("c", 2, now=1.0, lease_s=LEASE)  # evicts a
    assert "a" not in table
    res = table.reserve("a", 2, now=1.0, lease_s=LEASE)  # evicts b
    assert res is not None and [e.key for e in res.evicted] == ["b"]
    assert keys_of(table) == ["c", "a"]


def test_unpin_makes_an_entry_evictable_again():
    table = table_of(3)
    put_ready(table, "a", 3)
    table.pin("a")
    assert table.reserve("b", 1, now=0.0, lease_s=LEASE) is None
    table.unpin("a")
    res = table.reserve("b", 1, now=0.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["a"]


def test_a_reservation_at_an_earlier_time_than_one_already_seen_respects_the_announcement():
    table = table_of(9)
    put_ready(table, "a", 3)
    put_ready(table, "b", 3)
    table.announce("a", now=0.0, lease_s=10.0)
    assert table.evictable_blocks(12.0) == 6  # a's announcement has ended by 12.0
    # asked again about 5.0 (a caller's clock is not the table's concern): a is announced then
    assert table.evictable_blocks(5.0) == 3
    assert not table.can_fit(7, now=5.0)
    assert table.reserve("c", 7, now=5.0, lease_s=LEASE) is None
    assert keys_of(table) == ["a", "b"]
    res = table.reserve("c", 6, now=5.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["b"]
    assert table.get("a").is_announced(5.0)


def test_protect_may_be_any_container_of_keys():
    for protect in (["b", "b"], ("b",), {"b": 1}.keys(), {"b", "x", "y", "z", "w"}):
        table = table_of(9)
        put_ready(table, "a", 3)
        put_ready(table, "b", 3)
        put_ready(table, "c", 3)
        assert table.evictable_blocks(1.0, protect=protect) == 6, protect
        assert table.reserve("d", 7, now=1.0, lease_s=LEASE, protect=protect) is None
        res = table.reserve("d", 6, now=1.0, lease_s=LEASE, protect=protect)
        assert res is not None and [e.key for e in res.evicted] == ["a", "c"], protect
        assert keys_of(table) == ["b", "d"]


def test_an_entry_read_goes_to_the_back_of_the_queue_once_its_last_pin_is_released():
    table = table_of(9)
    for key in "abc":
        put_ready(table, key, 3)
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
    assert keys_of(table) == ["a", "e"]


def test_an_entry_a_peer_read_goes_to_the_back_of_the_queue_once_its_last_grant_is_released():
    table = table_of(6)
    put_ready(table, "a", 3)
    put_ready(table, "b", 3)
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
    table = table_of(6)
    put_ready(table, "a", 3)
    put_ready(table, "b", 3)
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
    table = table_of(64)
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
    table = table_of(6)
    put_ready(table, "a", 3)
    put_ready(table, "b", 3)
    table.pin("a")
    table.unpin("a")  # queued again, behind b
    assert table.evictable_blocks(10.0) == 6
    res = table.reserve("c", 3, now=5.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["b"]
