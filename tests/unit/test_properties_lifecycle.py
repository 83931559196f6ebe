"""Property test of the entry table's lifecycle against a reference model.

Random sequences of every table operation, with time advancing through `expire`, are run side by
side with `Model`, a plain reference model of the lifecycle. Deadlines are drawn on disjoint grids
(save leases end on .75, grants on .25, announcements on .5, quarantines on whole numbers) so the
order in which `expire` settles them is unambiguous.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from ec_connector.domain import cache
from ec_connector.domain.cache import EntryTable
from ec_connector.domain.entries import Phase
from ec_connector.domain.errors import IllegalTransition, UnknownEntry
from tests.unit.property_checks import SETTINGS, assert_maximal, blocks_of

# --- entry table -------------------------------------------------------------------------------

KEYS = ("a", "b", "c", "d", "e", "f", "g", "h")
NUM_BLOCKS = 16


@dataclass
class MEntry:
    key: str
    rows: int
    ready_deadline: float
    phase: str = "not_ready"
    pins: int = 0
    grants: dict[int, float] = field(default_factory=dict)
    announced_until: float = -math.inf
    reported_until: float = -math.inf
    quarantined_until: float = -math.inf
    queued: int = 0  # place in the eviction queue: reservation, or the release of its last pin/grant
    granted: dict[int, int] = field(default_factory=dict)  # grant id -> Model.grant_seq when made

    def pinned(self) -> bool:
        return self.pins > 0 or bool(self.grants)

    def evictable(self, now: float) -> bool:
        return self.phase == "ready" and not self.pinned() and not now < self.announced_until


class Model:
    """The lifecycle rules, written as plainly as possible: a list in reservation order, each entry
    with its place in the eviction queue."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.entries: dict[str, MEntry] = {}
        self.queue_end = 0
        self.grant_seq = 0  # grants in the order made: lapses at one deadline settle in that order

    def requeue(self, e: MEntry) -> None:
        if not e.pinned():
            self.queue_end += 1
            e.queued = self.queue_end

    @property
    def free(self) -> int:
        return self.num_blocks - sum(e.rows for e in self.entries.values())

    def reserve(self, key: str, rows: int, now: float, lease: float, protect: frozenset[str]):
        if key in self.entries:
            raise IllegalTransition(key)
        evictable = [e for e in self.entries.values() if e.evictable(now) and e.key not in protect]
        evictable.sort(key=lambda e: e.queued)
        if rows > self.free + sum(e.rows for e in evictable):
            return None
        evicted = []
        for victim in evictable:
            if rows <= self.free:
                break
            del self.entries[victim.key]
            evicted.append(victim.key)
        self.entries[key] = MEntry(key, rows, now + lease)
        self.requeue(self.entries[key])
        return evicted

    def need(self, key: str) -> MEntry:
        if key not in self.entries:
            raise UnknownEntry(key)
        return self.entries[key]

    def mark_ready(self, key: str) -> None:
        e = self.need(key)
        if e.phase != "not_ready":
            raise IllegalTransition(key)
        e.phase = "ready"

    def pin(self, key: str) -> None:
        e = self.need(key)
        if e.phase != "ready":
            raise IllegalTransition(key)
        e.pins += 1

    def unpin(self, key: str) -> None:
        e = self.need(key)
        if e.pins == 0:
            raise IllegalTransition(key)
        e.pins -= 1
        self.requeue(e)

    def grant(self, key: str, gid: int, deadline: float) -> None:
        e = self.need(key)
        if e.phase != "ready" or gid in e.grants:
            raise IllegalTransition(key)
        e.grants[gid] = deadline
        self.grant_seq += 1
        e.granted[gid] = self.grant_seq

    def release_grant(self, key: str, gid: int) -> bool:
        e = self.entries.get(key)
        if e is None or gid not in e.grants:
            return False
        del e.grants[gid]
        e.granted.pop(gid, None)
        if not e.grants:
            e.announced_until = -math.inf
        self.requeue(e)
        return True

    def announce(self, key: str, until: float) -> None:
        e = self.need(key)
        if e.phase == "quarantined":
            raise IllegalTransition(key)
        e.announced_until = max(e.announced_until, until)

    def extend(self, key: str, deadline: float) -> None:
        e = self.need(key)
        if e.phase != "not_ready":
            raise IllegalTransition(key)
        e.ready_deadline = max(e.ready_deadline, deadline)

    def quarantine(self, key: str, until: float) -> None:
        e = self.need(key)
        if e.phase != "not_ready":
            raise IllegalTransition(key)
        e.phase = "quarantined"
        e.quarantined_until = until

    def drop(self, key: str) -> None:
        e = self.need(key)
        if e.pinned() or e.phase == "quarantined":
            raise IllegalTransition(key)
        del self.entries[key]

    def expire(self, now: float, q: float) -> dict[str, list]:
        out: dict[str, list] = {"save": [], "grant": [], "announce": [], "settled": []}
        lapsed = []  # (deadline, made, entry): a lapsed grant is released, as by release_grant
        for e in list(self.entries.values()):
            events = []
            if e.phase == "not_ready" and e.ready_deadline <= now:
                events.append((e.ready_deadline, "save", 0))
            events += [(d, "grant", gid) for gid, d in e.grants.items() if d <= now]
            if e.announced_until <= now and e.announced_until != e.reported_until:
                events.append((e.announced_until, "announce", 0))
            if e.phase == "quarantined" and e.quarantined_until <= now:
                events.append((e.quarantined_until, "settle", 0))
            for _, kind, gid in sorted(events):
                if kind == "save":
                    e.phase, e.quarantined_until = "quarantined", now + q
                    out["save"].append(e.key)
                elif kind == "grant":
                    lapsed.append((e.grants.pop(gid), e.granted.pop(gid), e))
                    if not e.grants:
                        e.announced_until = -math.inf
                    out["grant"].append((e.key, gid))
                elif kind == "announce" and e.announced_until != -math.inf:
                    e.reported_until = e.announced_until
                    out["announce"].append(e.key)
                elif kind == "settle":
                    del self.entries[e.key]
                    out["settled"].append(e.key)
                    break
        for _, _, e in sorted(lapsed, key=lambda t: t[:2]):
            if not e.grants:  # the entry's last grant: queued again when the table released it
                self.requeue(e)
        return out


# Weighted so that most operations hit a live entry in a state where they are legal, while every
# illegal move still comes up often enough to be checked.
OP_WEIGHTS = {
    "reserve": 6,
    "mark_ready": 5,
    "pin": 2,
    "unpin": 2,
    "grant": 2,
    "release_grant": 2,
    "announce": 2,
    "extend": 1,
    "quarantine": 1,
    "drop": 1,
    "advance": 3,
}
OP_NAMES = [name for name, weight in OP_WEIGHTS.items() for _ in range(weight)]


_KEY_PICK = st.integers(0, 2 * len(KEYS) - 1)
_GRID = st.integers(0, 4)
_OP_ARGS = {
    "advance": st.tuples(st.integers(1, 4)),
    "reserve": st.tuples(
        st.one_of(st.integers(1, 5), st.integers(1, NUM_BLOCKS + 2)),
        st.integers(0, 12),
        st.frozensets(st.sampled_from(KEYS), max_size=3),
        # mostly the current time; sometimes a caller's clock ahead of or behind the last expire
        st.sampled_from((0, 0, 0, 0, 1, 3, -1, -3)),
    ),
    "grant": st.tuples(st.integers(1, 3), _GRID),
    "release_grant": st.tuples(st.integers(1, 3)),
    "announce": st.tuples(_GRID),
    "extend": st.tuples(_GRID),
    "quarantine": st.tuples(st.integers(1, 4)),
}
_OP = st.sampled_from(OP_NAMES).flatmap(
    lambda name: st.tuples(st.just(name), _KEY_PICK, _OP_ARGS.get(name, st.just(())))
)


def _draw_op(data: st.DataObject, model: Model) -> tuple:
    """One operation; its key is mostly a live entry's (except for reserve), else any key."""
    name, pick, args = data.draw(_OP, label="op")
    if name == "advance":
        return (name, *args)
    live = list(model.entries)
    if name != "reserve" and live and pick < len(KEYS):
        key = live[pick % len(live)]
    else:
        key = KEYS[pick % len(KEYS)]
    return (name, key, *args)


def _snapshot(table: EntryTable) -> list:
    return [
        (
            e.key,
            e.extents,
            e.rows,
            e.phase,
            e.pins,
            dict(e.grants),
            e.announced_until,
            e.ready_deadline,
            e.quarantined_until,
        )
        for e in table.entries()
    ] + [table.blocks.free_extents()]


def _check_agrees(table: EntryTable, model: Model) -> None:
    assert [e.key for e in table.entries()] == list(model.entries), "reservation (FIFO) order differs"
    for entry, m in zip(table.entries(), model.entries.values(), strict=True):
        assert entry.phase is Phase(m.phase), entry.key
        assert entry.rows == m.rows
        assert entry.pins == m.pins
        assert entry.grants == m.grants
        assert entry.announced_until == m.announced_until
        assert entry.ready_deadline == m.ready_deadline
        if m.phase == "quarantined":
            assert entry.quarantined_until == m.quarantined_until
    # entries' extents and the free extents partition [0, num_blocks) exactly
    owned = [b for e in table.entries() for b in blocks_of(e.extents)]
    free = blocks_of(table.blocks.free_extents())
    assert len(owned) == len(set(owned)), "two entries share a block"
    assert sorted(owned + free) == list(range(NUM_BLOCKS)), "blocks lost or invented"
    assert table.blocks.free_blocks == model.free
    assert_maximal(table.blocks.free_extents())


def _run(table: EntryTable, model: Model, op: tuple, now: float, q: float) -> float:
    name, *args = op
    if name == "advance":
        now += args[0]
        got = table.expire(now, quarantine_s=q)
        want = model.expire(now, q)
        assert sorted(got.save_lapsed) == sorted(want["save"])
        assert sorted(got.grants_released) == sorted(want["grant"])
        assert sorted(got.announcements_ended) == sorted(want["announce"])
        assert sorted(e.key for e in got.quarantines_settled) == sorted(want["settled"])
        assert bool(got) == any(want.values())
        return now
    if name == "reserve":
        key, rows, lease, protect, skew = args
        at = now + skew
        lease_s = lease + 0.75
        before = _snapshot(table)
        evictable_before = {e.key for e in table.entries() if e.is_evictable(at)} - protect
        try:
            want = model.reserve(key, rows, at, lease_s, protect)
        except IllegalTransition:
            want = IllegalTransition
        if want is IllegalTransition:
            try:
                table.reserve(key, rows, now=at, lease_s=lease_s, protect=protect)
            except IllegalTransition:
                assert _snapshot(table) == before
                return now
            raise AssertionError(f"reserve of held key {key!r} did not raise")
        got = table.reserve(key, rows, now=at, lease_s=lease_s, protect=protect)
        if want is None:
            assert got is None
            assert _snapshot(table) == before, "a failed reservation changed the table"
            return now
        assert got is not None
        evicted = [e.key for e in got.evicted]
        assert evicted == want, "eviction is not FIFO among evictable entries"
        assert set(evicted) <= evictable_before, "a pinned/not-ready/announced/protected entry was evicted"
        assert got.entry.key == key and got.entry.rows == rows
        assert got.entry.phase is Phase.NOT_READY
        return now
    key = args[0]
    if name == "release_grant":
        assert table.release_grant(key, args[1]) == model.release_grant(key, args[1])
        return now
    calls = {
        "mark_ready": (lambda: table.mark_ready(key), lambda: model.mark_ready(key)),
        "pin": (lambda: table.pin(key), lambda: model.pin(key)),
        "unpin": (lambda: table.unpin(key), lambda: model.unpin(key)),
        "drop": (lambda: table.drop(key), lambda: model.drop(key)),
    }
    if name == "grant":
        gid, lease_s = args[1], args[2] + 0.25
        calls[name] = (
            lambda: table.grant(key, gid, now=now, lease_s=lease_s),
            lambda: model.grant(key, gid, now + lease_s),
        )
    elif name == "announce":
        lease_s = args[1] + 0.5
        calls[name] = (
            lambda: table.announce(key, now=now, lease_s=lease_s),
            lambda: model.announce(key, now + lease_s),
        )
    elif name == "extend":
        deadline = now + args[1] + 0.75
        calls[name] = (
            lambda: table.extend_ready_deadline(key, deadline),
            lambda: model.extend(key, deadline),
        )
    elif name == "quarantine":
        span = float(args[1])
        calls[name] = (
            lambda: table.quarantine(key, now=now, quarantine_s=span),
            lambda: model.quarantine(key, now + span),
        )
    do_table, do_model = calls[name]
    try:
        do_model()
    except (IllegalTransition, UnknownEntry) as exc:
        before = _snapshot(table)
        try:
            do_table()
        except type(exc):
            assert _snapshot(table) == before, f"a refused {name} changed the table"
            return now
        raise AssertionError(f"{name}({key!r}) should raise {type(exc).__name__}") from None
    do_table()
    return now


@SETTINGS
@given(n_ops=st.integers(1, 80), q=st.integers(1, 5), compact=st.booleans(), data=st.data())
def test_table_follows_the_reference_lifecycle(n_ops, q, compact, data):
    # `compact`: the table rebuilds its heaps (dropping stale items) as often as it may, instead of
    # only past 64 items, so the rebuilds are checked against the model too
    saved = cache._MIN_COMPACT
    cache._MIN_COMPACT = 1 if compact else saved
    try:
        _follow_the_reference_lifecycle(n_ops, q, data)
    finally:
        cache._MIN_COMPACT = saved


def _follow_the_reference_lifecycle(n_ops: int, q: int, data: st.DataObject) -> None:
    table = EntryTable(NUM_BLOCKS)
    model = Model(NUM_BLOCKS)
    now = 0.0
    for _ in range(n_ops):
        op = _draw_op(data, model)
        now = _run(table, model, op, now, float(q))
        _check_agrees(table, model)
    # draining time settles every deadline: nothing stays not-ready, quarantined or pinned by a grant
    now = _run(table, model, ("advance", 100), now, float(q))
    now = _run(table, model, ("advance", 100), now, float(q))
    _check_agrees(table, model)
    for entry in table.entries():
        assert entry.phase is Phase.READY
        assert entry.grants == {}
        assert not entry.is_announced(now)
