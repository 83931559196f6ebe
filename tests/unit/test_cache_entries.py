"""Entry table: reserving, lookup, operations on unknown keys, dropping an entry."""

from __future__ import annotations

import pytest

from ec_connector.domain.blocks import Extent
from ec_connector.domain.entries import Phase
from ec_connector.domain.errors import IllegalTransition, UnknownEntry
from tests.unit.table_helpers import LEASE, Q, put_ready, table_of


def test_reserve_adds_a_not_ready_entry_with_a_save_lease():
    table = table_of()
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
    table = table_of()
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
    table = table_of()
    with pytest.raises(UnknownEntry):
        op(table)
    assert len(table) == 0


def test_unknown_entry_is_a_key_error():
    assert issubclass(UnknownEntry, KeyError)


def test_release_grant_of_an_unknown_key_is_false():
    assert table_of().release_grant("x", 1) is False


def test_reserve_of_a_key_already_held_is_illegal():
    table = table_of()
    table.reserve("a", 2, now=0.0, lease_s=LEASE)
    with pytest.raises(IllegalTransition, match="entry 'a' is already held"):
        table.reserve("a", 2, now=0.0, lease_s=LEASE)
    assert len(table) == 1 and table.blocks.free_blocks == 8


@pytest.mark.parametrize("rows", [0, -2])
def test_reserve_of_no_rows_is_a_caller_error(rows):
    with pytest.raises(ValueError, match=f"cannot reserve {rows} rows"):
        table_of().reserve("a", rows, now=0.0, lease_s=LEASE)


def test_drop_frees_an_unpinned_entry():
    table = table_of(10)
    table.reserve("a", 4, now=0.0, lease_s=LEASE)
    dropped = table.drop("a")
    assert dropped.key == "a"
    assert "a" not in table
    assert table.blocks.free_extents() == (Extent(0, 10),)


def test_drop_of_a_pinned_entry_is_illegal():
    table = table_of(10)
    put_ready(table, "a", 4)
    table.pin("a")
    with pytest.raises(IllegalTransition, match=r"entry 'a' is pinned \(1\); cannot drop"):
        table.drop("a")
    assert "a" in table and table.blocks.free_blocks == 6


def test_drop_of_a_granted_entry_is_illegal():
    table = table_of(10)
    put_ready(table, "a", 4)
    table.grant("a", 9, now=0.0, lease_s=5.0)
    with pytest.raises(IllegalTransition, match=r"entry 'a' is pinned \(1\)"):
        table.drop("a")


def test_drop_of_a_quarantined_entry_is_illegal():
    table = table_of(10)
    table.reserve("a", 4, now=0.0, lease_s=LEASE)
    table.quarantine("a", now=0.0, quarantine_s=Q)
    with pytest.raises(IllegalTransition, match="entry 'a' is quarantined; it is freed when that ends"):
        table.drop("a")
    assert table.get("a").phase is Phase.QUARANTINED
    assert table.blocks.free_blocks == 6
