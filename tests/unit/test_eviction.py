"""Eviction policies in the entry table: S3-FIFO's order, and the table's guarantees under every
policy (never a pinned, not-ready, granted, announced or protected victim; blocks conserved; a
reservation that cannot fit evicts nothing)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ec_connector.domain.cache import EntryTable
from ec_connector.domain.eviction import (
    FIFO,
    GHOST_SHARE,
    MAX_READS,
    POLICIES,
    S3FIFO,
    SMALL_SHARE,
    make_policy,
)

LEASE = 100.0
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _ready(table: EntryTable, key: str, rows: int, now: float = 0.0) -> None:
    assert table.reserve(key, rows, now=now, lease_s=LEASE) is not None
    table.mark_ready(key)


def _read(table: EntryTable, key: str) -> None:
    table.pin(key)
    table.unpin(key)


def seed(table: EntryTable, specs: list[tuple[int, str]]) -> set[str]:
    """Reserve entries k0, k1, ... of the given sizes in the given states (KINDS) until the table is
    full; returns the keys no policy may evict (pinned, granted, announced, not ready, quarantined)."""
    held: set[str] = set()
    for i, (size, kind) in enumerate(specs):
        key = f"k{i}"
        if size > table.blocks.free_blocks:
            break
        table.reserve(key, size, now=0.0, lease_s=LEASE)
        if kind == "quarantined":
            table.quarantine(key, now=0.0, quarantine_s=LEASE)
        elif kind != "not_ready":
            table.mark_ready(key)
        if kind == "read":
            _read(table, key)
        elif kind == "pinned":
            table.pin(key)
        elif kind == "granted":
            table.grant(key, i, now=0.0, lease_s=LEASE)
        elif kind == "announced":
            table.announce(key, now=0.0, lease_s=LEASE)
        if kind in ("pinned", "granted", "announced", "not_ready", "quarantined"):
            held.add(key)
    return held


def reserve_checked(table: EntryTable, key: str, rows: int, *, held: set[str], protect: set[str]) -> bool:
    """Reserve `key` under `protect` and check the table's guarantees: a reservation that cannot fit
    fails and changes nothing; one that fits evicts no held or protected entry and nothing it did
    not hold; then `key` is marked ready and the blocks are checked (`check_blocks`). True when it fit."""
    keys_before = {e.key for e in table.entries()}
    free = table.blocks.free_blocks
    evictable = sum(e.rows for e in table.entries() if e.is_evictable(1.0) and e.key not in protect)
    res = table.reserve(key, rows, now=1.0, lease_s=LEASE, protect=protect)
    if rows > free + evictable:
        assert res is None, "a reservation that cannot fit must fail"
        assert {e.key for e in table.entries()} == keys_before, "a failed reservation evicted"
        assert table.blocks.free_blocks == free
        return False
    assert res is not None
    victims = {e.key for e in res.evicted}
    assert not victims & held, "a pinned/granted/announced/not-ready/quarantined entry was evicted"
    assert not victims & protect, "a protected entry was evicted"
    assert victims <= keys_before
    table.mark_ready(key)
    check_blocks(table)
    return True


def check_blocks(table: EntryTable) -> None:
    """Every entry's extents and the free extents partition the region; the evictable count is right."""
    owned = [b for e in table.entries() for x in e.extents for b in range(x.start, x.start + x.length)]
    free_blocks = [b for x in table.blocks.free_extents() for b in range(x.start, x.start + x.length)]
    assert len(owned) == len(set(owned)), "two entries share a block"
    assert sorted(owned + free_blocks) == list(range(table.blocks.num_blocks)), "blocks lost or invented"
    assert table.evictable_blocks(1.0) == sum(e.rows for e in table.entries() if e.is_evictable(1.0))


def _evicted(table: EntryTable, key: str, rows: int) -> list[str]:
    res = table.reserve(key, rows, now=1.0, lease_s=LEASE)
    assert res is not None
    return [e.key for e in res.evicted]


def test_the_table_evicts_fifo_unless_told_otherwise():
    assert EntryTable(10).eviction == FIFO
    assert EntryTable(10, eviction=S3FIFO).eviction == S3FIFO


def test_an_unknown_policy_is_refused_naming_the_accepted_ones():
    with pytest.raises(ValueError, match="'lru'.*fifo, s3fifo, lecar, duel"):
        EntryTable(10, eviction="lru")
    with pytest.raises(ValueError):
        make_policy("lru", num_blocks=1, evictable={}, min_compact=1)


def test_s3fifo_evicts_an_image_seen_once_before_an_older_one_read_again():
    table = EntryTable(100, eviction=S3FIFO)
    _ready(table, "hot", 40)
    _read(table, "hot")
    _ready(table, "once", 40)
    # fifo would evict "hot" (the older); s3fifo moves it to the main queue and takes "once"
    assert _evicted(table, "new", 40) == ["once"]
    fifo = EntryTable(100, eviction=FIFO)
    _ready(fifo, "hot", 40)
    _ready(fifo, "once", 40)
    _read(fifo, "once")
    assert _evicted(fifo, "new", 40) == ["hot"]


def test_s3fifo_a_scan_of_one_hit_images_does_not_flush_what_is_read_again():
    table = EntryTable(100, eviction=S3FIFO)
    for i in range(5):
        _ready(table, f"hot{i}", 10)
        _read(table, f"hot{i}")
    for i in range(200):  # a scan 20x the region, every image seen once
        _ready(table, f"scan{i}", 5, now=1.0)
    assert all(f"hot{i}" in table for i in range(5))


def test_s3fifo_a_key_evicted_from_the_small_queue_comes_back_into_the_main_queue():
    table = EntryTable(100, eviction=S3FIFO)
    _ready(table, "a", 50)
    _ready(table, "b", 50)
    assert _evicted(table, "c", 50) == ["a"]  # "a" is a ghost now
    table.mark_ready("c")
    _ready(table, "a", 50)  # evicts "b"; "a" joins the main queue
    assert "b" not in table
    _ready(table, "d", 50)  # the small queue ("c") is over its share: its unread entry goes first
    assert "a" in table and "c" not in table


def test_s3fifo_remembers_evicted_keys_up_to_its_ghost_share_of_the_region():
    # ten 10-block entries fill 100 blocks; b..j are read, so they move to the main queue when the
    # small queue next turns over. The ghost keeps 40 blocks of keys: a, k and l (30) all stay in
    # it, so "a" comes back into the main queue and the empty small queue sends the next victim
    # to the main queue's head, "b". With a ghost of 25 blocks "a" would have been forgotten,
    # rejoined the small queue unread and been evicted again.
    assert GHOST_SHARE == 0.40
    table = EntryTable(100, eviction=S3FIFO)
    for key in "abcdefghij":
        _ready(table, key, 10)
    for key in "bcdefghij":
        _read(table, key)
    victims = []
    for key in "klman":
        victims += _evicted(table, key, 10)
        table.mark_ready(key)
    assert victims == ["a", "k", "l", "m", "b"]


def test_s3fifo_the_main_queue_evicts_the_first_entry_not_read_since_it_last_went_round():
    table = EntryTable(40, eviction=S3FIFO)
    for key in "abcd":
        _ready(table, key, 10)
        _read(table, key)
    # each was read in the small queue: all move to the main queue (reads reset), then "a" goes
    assert _evicted(table, "x", 10) == ["a"]
    table.mark_ready("x")
    for _ in range(3):
        _read(table, "b")
    _read(table, "c")
    _read(table, "x")
    # "x" moves on; "b" and "c" spend a read each and go round; "d" was not read: it goes
    assert _evicted(table, "y", 10) == ["d"]


def test_s3fifo_finds_a_victim_read_in_the_small_queue_while_the_main_queue_is_held():
    table = EntryTable(40, eviction=S3FIFO)
    _ready(table, "a", 10)
    _read(table, "a")
    _ready(table, "b", 28)
    _ready(table, "x", 1)
    assert _evicted(table, "z", 2) == ["b"]  # "a" moves to the main queue on the way
    table.mark_ready("z")
    _read(table, "x")
    _read(table, "z")
    table.pin("a")  # the main queue holds only a held entry; the small queue (3 blocks) is under its share
    # the small queue's round moves "x" and "z" to the main queue, where the victim is then found
    assert _evicted(table, "y", table.blocks.free_blocks + 1) == ["x"]


@pytest.mark.parametrize("policy", POLICIES)
def test_queues_stay_proportional_to_the_evictable_entries(policy):
    table = EntryTable(64, eviction=policy)
    for i in range(3000):
        key = f"k{i}"
        assert table.reserve(key, 1 + i % 5, now=float(i), lease_s=LEASE) is not None
        table.mark_ready(key)
        if i % 2:
            _read(table, key)
        if i % 7 == 0:
            table.drop(key)
    # `lecar` and `duel` order the entries twice (an LRU dict, LFU count queues with stale items)
    orders = 2 if policy in ("lecar", "duel") else 1
    assert table._policy.queued() <= orders * (2 * len(table) + 64)


# --- properties, every policy: the table's guarantees hold whatever the order --------------------

KINDS = ["ready", "ready", "ready", "read", "pinned", "granted", "announced", "not_ready", "quarantined"]


@SETTINGS
@given(
    policy=st.sampled_from(POLICIES),
    specs=st.lists(st.tuples(st.integers(1, 6), st.sampled_from(KINDS)), min_size=1, max_size=24),
    later=st.lists(
        st.tuples(st.integers(1, 30), st.frozensets(st.integers(0, 23), max_size=4), st.integers(0, 3)),
        max_size=8,
    ),
)
def test_no_policy_evicts_a_held_entry_and_blocks_are_conserved(policy, specs, later):
    table = EntryTable(48, eviction=policy)
    held = seed(table, specs)
    for n, (rows, protect_ids, reads) in enumerate(later):
        protect = {f"k{i}" for i in protect_ids}
        if reserve_checked(table, f"new{n}", rows, held=held, protect=protect):
            for _ in range(reads):  # reads move entries between s3fifo's queues
                _read(table, f"new{n}")
                check_blocks(table)


# --- S3-FIFO against a reference model (ready entries, reads and reservations only) -------------


class S3Model:
    """S3-FIFO written plainly: lists scanned front to back, no stamps, no lazy deletion."""

    def __init__(self, num_blocks: int) -> None:
        self.small_target = max(1, int(num_blocks * SMALL_SHARE))
        self.ghost_limit = max(1, int(num_blocks * GHOST_SHARE))
        self.free = num_blocks
        self.small: list[str] = []
        self.main: list[str] = []
        self.ghost: list[tuple[str, int]] = []
        self.rows: dict[str, int] = {}
        self.reads: dict[str, int] = {}

    def reserve(self, key: str, rows: int) -> list[str] | None:
        if rows > self.free + sum(self.rows.values()):
            return None
        evicted: list[str] = []
        while self.free < rows:
            small_rows = sum(self.rows[k] for k in self.small)
            victim = None
            if small_rows >= self.small_target or not self.main:
                victim = self._small()
            if victim is None:
                victim = self._main() or self._small()
            assert victim is not None
            evicted.append(victim)
            self.free += self.rows.pop(victim)
            del self.reads[victim]
        ghost = dict(self.ghost)
        (self.main if key in ghost else self.small).append(key)
        self.ghost = [(k, r) for k, r in self.ghost if k != key]
        self.rows[key], self.reads[key] = rows, 0
        self.free -= rows
        return evicted

    def read(self, key: str) -> None:
        self.reads[key] = min(MAX_READS, self.reads[key] + 1)

    def _small(self) -> str | None:
        while self.small:
            key = self.small.pop(0)
            if self.reads[key]:
                self.reads[key] = 0
                self.main.append(key)
                continue
            self.ghost.append((key, self.rows[key]))
            while sum(r for _, r in self.ghost) > self.ghost_limit:
                self.ghost.pop(0)
            return key
        return None

    def _main(self) -> str | None:
        while self.main:
            key = self.main.pop(0)
            if self.reads[key]:
                self.reads[key] -= 1
                self.main.append(key)
                continue
            return key
        return None


@SETTINGS
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("reserve"), st.integers(0, 40), st.integers(1, 12)),
            st.tuples(st.just("read"), st.integers(0, 40), st.just(0)),
        ),
        max_size=120,
    )
)
def test_s3fifo_evicts_as_the_reference_model(ops):
    follow_model(EntryTable(60, eviction=S3FIFO), S3Model(60), ops)


def follow_model(table: EntryTable, model: S3Model, ops: list[tuple[str, int, int]]) -> None:
    """Apply `ops` to `table` and `model` alike; each reservation evicts what the model evicts, and
    both end holding the same keys. Ops: ("reserve", k, rows), ("read", k, 0) and, for a model with
    copies (`reserve_copy`), ("copy", k, rows) (a pulled copy never loaded) and ("pull", k, rows) (a
    pulled copy its request loads)."""
    for op, k, rows in ops:
        key = f"k{k}"
        if op == "read":
            if key in table:
                _read(table, key)
                model.read(key)
            continue
        if key in table:
            continue
        want = model.reserve(key, rows) if op == "reserve" else model.reserve_copy(key, rows)
        got = table.reserve(key, rows, now=0.0, lease_s=LEASE)
        if want is None:
            assert got is None
            continue
        assert got is not None
        assert [e.key for e in got.evicted] == want
        if op != "reserve":
            table.mark_copy(key)
        table.mark_ready(key)
        if op == "pull":
            _read(table, key)
            model.read(key)
    assert {e.key for e in table.entries()} == set(model.rows)
