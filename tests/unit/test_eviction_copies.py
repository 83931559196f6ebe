"""Pulled copies in the entry table: a copy of an item a live peer holds (`EntryTable.mark_copy`)
goes before the entries this replica encoded, its pulling load is not a read, and a copy read here
again becomes this replica's own. S3-FIFO with copies against a plain reference model, and the
table's guarantees with copies among the entries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ec_connector.domain.cache import EntryTable
from ec_connector.domain.errors import IllegalTransition
from ec_connector.domain.eviction import DUEL, FIFO, POLICIES, S3FIFO
from tests.unit.test_eviction import (
    LEASE,
    SETTINGS,
    S3Model,
    _evicted,
    _read,
    _ready,
    follow_model,
    reserve_checked,
    seed,
)

COPY_AWARE = [S3FIFO, DUEL]


def _copy(table: EntryTable, key: str, rows: int, *, loaded: bool = True) -> None:
    """A fleet pull of `key`: reserved, marked a copy, READY, then loaded by its request."""
    assert table.reserve(key, rows, now=0.0, lease_s=LEASE) is not None
    table.mark_copy(key)
    table.mark_ready(key)
    if loaded:
        _read(table, key)


@pytest.mark.parametrize("policy", COPY_AWARE)
def test_a_pulled_copy_goes_before_an_older_entry_encoded_here(policy):
    table = EntryTable(20, eviction=policy)
    _ready(table, "own", 10)
    _copy(table, "copy", 10)
    assert _evicted(table, "new", 5) == ["copy"]


@pytest.mark.parametrize("policy", COPY_AWARE)
def test_a_copy_goes_before_main_queue_entries_too_and_oldest_copy_first(policy):
    table = EntryTable(40, eviction=policy)
    for key in ("a", "b"):
        _ready(table, key, 10)
        _read(table, key)
    _copy(table, "c1", 5)
    _copy(table, "c2", 5)
    _ready(table, "d", 10)  # full: 40 blocks
    assert _evicted(table, "x", 5) == ["c1"]
    assert _evicted(table, "y", 5) == ["c2"]


@pytest.mark.parametrize("policy", COPY_AWARE)
def test_a_copy_read_here_again_is_kept_as_this_replicas_own(policy):
    table = EntryTable(20, eviction=policy)
    _ready(table, "own", 10)
    _copy(table, "copy", 10)
    _read(table, "copy")  # a local request after the pulling load: it is this replica's own, read
    # "own" (never read) is now the first to go (s3fifo: from the small queue; duel: fewer requests)
    assert _evicted(table, "new", 5) == ["own"]
    assert "copy" in table


@pytest.mark.parametrize("policy", COPY_AWARE)
def test_a_held_copy_is_passed_over(policy):
    table = EntryTable(20, eviction=policy)
    _ready(table, "own", 10)
    _copy(table, "copy", 10)
    table.grant("copy", 1, now=0.0, lease_s=LEASE)  # another peer READs the copy
    assert _evicted(table, "new", 5) == ["own"]


@pytest.mark.parametrize("policy", COPY_AWARE)
def test_only_a_reservation_can_be_marked_a_copy(policy):
    table = EntryTable(20, eviction=policy)
    _ready(table, "k", 4)
    with pytest.raises(IllegalTransition):
        table.mark_copy("k")


def test_fifo_queues_a_copy_as_any_entry():
    table = EntryTable(20, eviction=FIFO)
    _ready(table, "own", 10)
    _copy(table, "copy", 10, loaded=False)
    assert _evicted(table, "new", 5) == ["own"]


# --- S3-FIFO with copies against the reference model --------------------------------------------


class S3CopyModel(S3Model):
    """The reference model with a copies list: evicted first, front to back, never remembered in
    the ghost; its first read is not counted, the second moves it to the small queue's back, read
    once."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.copies: list[str] = []
        self.loaded: set[str] = set()

    def reserve_copy(self, key: str, rows: int) -> list[str] | None:
        evicted = self.reserve(key, rows)
        if evicted is not None:
            (self.main if key in self.main else self.small).remove(key)
            self.copies.append(key)
        return evicted

    def reserve(self, key: str, rows: int) -> list[str] | None:
        if rows > self.free + sum(self.rows.values()):
            return None
        evicted = []
        while self.copies and self.free < rows:
            victim = self.copies.pop(0)
            evicted.append(victim)
            self.free += self.rows.pop(victim)
            del self.reads[victim]
            self.loaded.discard(victim)
        rest = super().reserve(key, rows)
        assert rest is not None
        return evicted + rest

    def read(self, key: str) -> None:
        if key not in self.copies:
            super().read(key)
        elif key not in self.loaded:
            self.loaded.add(key)
        else:
            self.copies.remove(key)
            self.loaded.discard(key)
            self.small.append(key)
            self.reads[key] = 1


@SETTINGS
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.sampled_from(["reserve", "copy", "pull"]), st.integers(0, 40), st.integers(1, 12)),
            st.tuples(st.just("read"), st.integers(0, 40), st.just(0)),
        ),
        max_size=120,
    )
)
def test_s3fifo_with_copies_evicts_as_the_reference_model(ops):
    follow_model(EntryTable(60, eviction=S3FIFO), S3CopyModel(60), ops)


@SETTINGS
@given(
    policy=st.sampled_from(POLICIES),
    specs=st.lists(st.tuples(st.integers(1, 6), st.sampled_from(["ready", "pinned", "read"])), max_size=12),
    copies=st.lists(
        st.tuples(st.integers(1, 6), st.sampled_from(["ready", "loaded", "pinned", "granted", "not_ready"])),
        max_size=8,
    ),
    later=st.lists(st.tuples(st.integers(1, 30), st.frozensets(st.integers(0, 7), max_size=3)), max_size=8),
)
def test_copies_keep_the_tables_guarantees(policy, specs, copies, later):
    table = EntryTable(48, eviction=policy)
    held = seed(table, specs)
    for i, (rows, kind) in enumerate(copies):
        key = f"c{i}"
        if rows > table.blocks.free_blocks:
            break
        table.reserve(key, rows, now=0.0, lease_s=LEASE)
        table.mark_copy(key)
        if kind == "not_ready":
            held.add(key)
            continue
        table.mark_ready(key)
        if kind == "loaded":
            _read(table, key)
        elif kind == "pinned":
            table.pin(key)
            held.add(key)
        elif kind == "granted":
            table.grant(key, 1000 + i, now=0.0, lease_s=LEASE)
            held.add(key)
    for n, (rows, protect_ids) in enumerate(later):
        reserve_checked(table, f"new{n}", rows, held=held, protect={f"c{i}" for i in protect_ids})
    assert table._policy.queued() <= 2 * len(table) + 64
