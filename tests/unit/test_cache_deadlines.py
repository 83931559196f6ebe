"""Entry table: deadlines settled by `expire`: lapsed save leases quarantine, quarantines free their
blocks, lapsed grants are released, announcements end once."""

from __future__ import annotations

from ec_connector.domain.blocks import Extent
from ec_connector.domain.entries import Phase
from tests.unit.table_helpers import LEASE, Q, put_ready, table_of


def test_expire_with_nothing_due_settles_nothing():
    table = table_of(10)
    table.reserve("a", 4, now=0.0, lease_s=LEASE)
    out = table.expire(29.9, quarantine_s=Q)
    assert not out
    assert table.get("a").phase is Phase.NOT_READY


def test_lapsed_save_lease_quarantines_then_frees_the_blocks():
    table = table_of(10)
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
    table = table_of(10)
    table.reserve("a", 4, now=0.0, lease_s=LEASE)
    table.expire(45.0, quarantine_s=Q)
    assert table.get("a").quarantined_until == 105.0


def test_ready_entry_save_lease_never_lapses():
    table = table_of(10)
    put_ready(table, "a", 4)
    out = table.expire(1000.0, quarantine_s=Q)
    assert out.save_lapsed == []
    assert table.is_ready("a")


def test_extended_save_lease_lapses_only_at_the_new_deadline():
    table = table_of(10)
    table.reserve("a", 4, now=0.0, lease_s=LEASE)
    table.extend_ready_deadline("a", 50.0)
    assert not table.expire(40.0, quarantine_s=Q)
    assert table.get("a").phase is Phase.NOT_READY
    out = table.expire(50.0, quarantine_s=Q)
    assert out.save_lapsed == ["a"]


def test_explicit_quarantine_frees_blocks_when_it_ends():
    table = table_of(10)
    table.reserve("a", 4, now=0.0, lease_s=LEASE)
    entry = table.quarantine("a", now=1.0, quarantine_s=20.0)
    assert entry.quarantined_until == 21.0
    out = table.expire(30.0, quarantine_s=Q)
    assert out.save_lapsed == []  # the quarantined entry's save lease no longer matters
    assert [e.key for e in out.quarantines_settled] == ["a"]
    assert table.blocks.free_blocks == 10


def test_lapsed_grant_is_released():
    table = table_of(10)
    put_ready(table, "a", 4)
    table.grant("a", 3, now=0.0, lease_s=30.0)
    table.grant("a", 4, now=10.0, lease_s=30.0)
    out = table.expire(30.0, quarantine_s=Q)
    assert out.grants_released == [("a", 3)]
    assert table.get("a").grants == {4: 40.0}
    out = table.expire(40.0, quarantine_s=Q)
    assert out.grants_released == [("a", 4)]
    assert table.get("a").pin_count == 0


def test_grant_released_before_its_lease_is_not_reported_by_expire():
    table = table_of(10)
    put_ready(table, "a", 4)
    table.grant("a", 3, now=0.0, lease_s=30.0)
    assert table.release_grant("a", 3) is True
    assert table.release_grant("a", 3) is False
    assert not table.expire(31.0, quarantine_s=Q)


def test_reused_grant_id_lapses_at_its_own_deadline():
    table = table_of(10)
    put_ready(table, "a", 4)
    table.grant("a", 3, now=0.0, lease_s=10.0)
    table.release_grant("a", 3)
    table.grant("a", 3, now=5.0, lease_s=10.0)
    assert not table.expire(10.0, quarantine_s=Q)
    assert table.get("a").grants == {3: 15.0}
    assert table.expire(15.0, quarantine_s=Q).grants_released == [("a", 3)]


def test_announcement_end_is_reported_once():
    table = table_of(10)
    put_ready(table, "a", 4)
    table.announce("a", now=0.0, lease_s=60.0)
    table.announce("a", now=0.0, lease_s=60.0)
    assert not table.expire(59.0, quarantine_s=Q)
    out = table.expire(60.0, quarantine_s=Q)
    assert out.announcements_ended == ["a"]
    assert table.get("a").is_evictable(60.0)
    assert not table.expire(200.0, quarantine_s=Q)


def test_extended_announcement_is_reported_at_its_latest_end():
    table = table_of(10)
    put_ready(table, "a", 4)
    table.announce("a", now=0.0, lease_s=60.0)
    table.announce("a", now=30.0, lease_s=60.0)
    assert not table.expire(60.0, quarantine_s=Q)
    assert table.expire(90.0, quarantine_s=Q).announcements_ended == ["a"]


def test_released_grant_ends_the_announcement():
    table = table_of(10)
    put_ready(table, "a", 4)
    table.announce("a", now=0.0, lease_s=60.0)
    table.grant("a", 1, now=0.0, lease_s=30.0)
    table.release_grant("a", 1)
    assert table.get("a").is_evictable(1.0)
    assert table.evictable_blocks(1.0) == 4


def test_deadlines_of_a_freed_entry_do_not_touch_a_new_entry_with_the_same_key():
    table = table_of(10)
    table.reserve("a", 4, now=0.0, lease_s=10.0)
    table.drop("a")
    table.reserve("a", 4, now=5.0, lease_s=10.0)
    assert not table.expire(10.0, quarantine_s=Q)
    assert table.get("a").phase is Phase.NOT_READY
    assert table.expire(15.0, quarantine_s=Q).save_lapsed == ["a"]


def test_expiry_is_falsy_only_when_empty():
    table = table_of(10)
    put_ready(table, "a", 4)
    table.grant("a", 1, now=0.0, lease_s=1.0)
    assert table.expire(1.0, quarantine_s=Q)
