"""Entry lifecycle: NOT_READY -> READY <-> pinned; NOT_READY -> QUARANTINED; illegal moves raise."""

from __future__ import annotations

import math

import pytest

from ec_connector.domain.blocks import Extent
from ec_connector.domain.entries import Entry, Phase
from ec_connector.domain.errors import IllegalTransition


def _entry(key: str = "img", rows: int = 4, deadline: float = 10.0) -> Entry:
    return Entry(key=key, extents=(Extent(0, rows),), rows=rows, ready_deadline=deadline)


def _ready(key: str = "img") -> Entry:
    entry = _entry(key)
    entry.mark_ready()
    return entry


def _state(entry: Entry) -> tuple:
    return (
        entry.phase,
        entry.pins,
        dict(entry.grants),
        entry.announced_until,
        entry.quarantined_until,
        entry.ready_deadline,
    )


def test_new_entry_is_not_ready_unpinned_and_unannounced():
    entry = _entry()
    assert entry.phase is Phase.NOT_READY
    assert not entry.is_ready
    assert entry.pin_count == 0
    assert not entry.is_pinned
    assert not entry.is_announced(0.0)
    assert entry.announced_until == -math.inf
    assert entry.grants == {}


def test_entry_needs_at_least_one_row():
    with pytest.raises(ValueError, match="entry 'x' must hold at least one row, got 0"):
        Entry(key="x", extents=(), rows=0, ready_deadline=1.0)


def test_entry_rows_must_equal_the_blocks_its_extents_cover():
    with pytest.raises(ValueError, match="entry 'x' has 5 rows but its extents cover 4 blocks"):
        Entry(key="x", extents=(Extent(0, 1), Extent(4, 3)), rows=5, ready_deadline=1.0)
    entry = Entry(key="x", extents=(Extent(0, 1), Extent(4, 3)), rows=4, ready_deadline=1.0)
    assert entry.rows == 4


def test_not_ready_entry_is_never_evictable():
    assert not _entry().is_evictable(0.0)


def test_mark_ready_makes_an_unpinned_unannounced_entry_evictable():
    entry = _entry()
    entry.mark_ready()
    assert entry.phase is Phase.READY
    assert entry.is_ready
    assert entry.is_evictable(0.0)


def test_mark_ready_twice_is_illegal():
    entry = _ready()
    with pytest.raises(IllegalTransition, match=r"cannot mark ready in phase ready \(needs not_ready\)"):
        entry.mark_ready()
    assert entry.phase is Phase.READY


def test_pinned_entry_is_not_evictable_until_every_pin_is_released():
    entry = _ready()
    entry.pin()
    entry.pin()
    assert entry.pin_count == 2
    assert entry.is_pinned and not entry.is_evictable(0.0)
    entry.unpin()
    assert entry.pin_count == 1 and not entry.is_evictable(0.0)
    entry.unpin()
    assert entry.pin_count == 0 and entry.is_evictable(0.0)


def test_pin_of_a_not_ready_entry_is_illegal():
    entry = _entry()
    before = _state(entry)
    with pytest.raises(IllegalTransition, match=r"cannot pin in phase not_ready \(needs ready\)"):
        entry.pin()
    assert _state(entry) == before


def test_unpin_without_a_pin_is_illegal():
    entry = _ready()
    with pytest.raises(IllegalTransition, match="unpin without a matching pin"):
        entry.unpin()
    assert entry.pins == 0


def test_unpin_does_not_release_a_grant():
    entry = _ready()
    entry.grant(7, deadline=5.0)
    with pytest.raises(IllegalTransition, match="unpin without a matching pin"):
        entry.unpin()
    assert entry.grants == {7: 5.0}


def test_each_grant_is_a_pin_with_its_own_lease():
    entry = _ready()
    entry.grant(1, deadline=5.0)
    entry.grant(2, deadline=6.0)
    entry.pin()
    assert entry.grants == {1: 5.0, 2: 6.0}
    assert entry.pin_count == 3
    assert not entry.is_evictable(0.0)


def test_grant_of_a_not_ready_entry_is_illegal():
    entry = _entry()
    with pytest.raises(IllegalTransition, match=r"cannot grant a peer read in phase not_ready"):
        entry.grant(1, deadline=5.0)
    assert entry.grants == {}


def test_grant_id_already_outstanding_is_illegal():
    entry = _ready()
    entry.grant(1, deadline=5.0)
    with pytest.raises(IllegalTransition, match="grant 1 already outstanding"):
        entry.grant(1, deadline=9.0)
    assert entry.grants == {1: 5.0}


def test_release_grant_unpins_and_ends_the_announcement():
    entry = _ready()
    entry.announce(until=100.0)
    entry.grant(1, deadline=5.0)
    assert entry.release_grant(1) is True
    assert entry.grants == {}
    assert not entry.is_announced(0.0)
    assert entry.is_evictable(0.0)


def test_announcement_outlives_a_read_while_another_read_is_outstanding():
    entry = _ready()
    entry.announce(until=100.0)
    entry.grant(1, deadline=5.0)
    entry.grant(2, deadline=5.0)
    assert entry.release_grant(1) is True
    assert entry.is_announced(0.0)
    assert entry.release_grant(2) is True
    assert not entry.is_announced(0.0)
    assert entry.is_evictable(0.0)


def test_release_of_an_unknown_grant_is_false_and_changes_nothing():
    entry = _ready()
    entry.announce(until=100.0)
    entry.grant(1, deadline=5.0)
    before = _state(entry)
    assert entry.release_grant(2) is False
    assert _state(entry) == before


def test_announced_entry_is_not_evictable_until_the_announcement_ends():
    entry = _ready()
    entry.announce(until=10.0)
    assert entry.is_announced(9.99)
    assert not entry.is_evictable(9.99)
    assert not entry.is_announced(10.0)
    assert entry.is_evictable(10.0)


def test_announce_only_extends_never_shortens():
    entry = _ready()
    entry.announce(until=10.0)
    entry.announce(until=4.0)
    assert entry.announced_until == 10.0
    entry.announce(until=12.0)
    assert entry.announced_until == 12.0


def test_not_ready_entry_may_be_announced():
    entry = _entry()
    entry.announce(until=3.0)
    assert entry.is_announced(0.0)
    assert entry.phase is Phase.NOT_READY


def test_quarantined_entry_cannot_be_announced():
    entry = _entry()
    entry.quarantine(until=60.0)
    with pytest.raises(IllegalTransition, match="a quarantined entry cannot be announced"):
        entry.announce(until=5.0)
    assert entry.announced_until == -math.inf


def test_quarantine_holds_a_not_ready_entry_until_its_deadline():
    entry = _entry()
    entry.quarantine(until=60.0)
    assert entry.phase is Phase.QUARANTINED
    assert entry.quarantined_until == 60.0
    assert not entry.is_ready
    assert not entry.is_evictable(1e9)


@pytest.mark.parametrize(
    "action",
    [
        lambda e: e.mark_ready(),
        lambda e: e.pin(),
        lambda e: e.grant(1, 5.0),
        lambda e: e.quarantine(70.0),
        lambda e: e.extend_ready_deadline(99.0),
    ],
    ids=["mark_ready", "pin", "grant", "quarantine", "extend_ready_deadline"],
)
def test_quarantined_entry_refuses_every_transition(action):
    entry = _entry()
    entry.quarantine(until=60.0)
    before = _state(entry)
    with pytest.raises(IllegalTransition, match="in phase quarantined"):
        action(entry)
    assert _state(entry) == before


def test_ready_entry_cannot_be_quarantined():
    entry = _ready()
    with pytest.raises(IllegalTransition, match=r"cannot quarantine in phase ready \(needs not_ready\)"):
        entry.quarantine(until=60.0)
    assert entry.phase is Phase.READY


def test_extend_ready_deadline_only_moves_the_save_lease_later():
    entry = _entry(deadline=10.0)
    entry.extend_ready_deadline(15.0)
    assert entry.ready_deadline == 15.0
    entry.extend_ready_deadline(12.0)
    assert entry.ready_deadline == 15.0


def test_extend_ready_deadline_of_a_ready_entry_is_illegal():
    entry = _ready()
    with pytest.raises(IllegalTransition, match="cannot extend its save lease in phase ready"):
        entry.extend_ready_deadline(99.0)
    assert entry.ready_deadline == 10.0


def test_illegal_transition_message_names_the_entry():
    entry = _entry(key="mm-abc")
    with pytest.raises(IllegalTransition, match="entry 'mm-abc'"):
        entry.pin()
