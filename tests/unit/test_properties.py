"""Property tests: the allocator and the entry table against simple reference models.

Allocator: blocks are never double-owned and never lost, free extents stay maximal, an allocation
is one run whenever a free extent is large enough and otherwise the fewest runs possible.

Table: random sequences of every table operation, with time advancing through `expire`, are run
side by side with `Model`, a plain reference model of the lifecycle. Deadlines are drawn on
disjoint grids (save leases end on .75, grants on .25, announcements on .5, quarantines on whole
numbers) so the order in which `expire` settles them is unambiguous.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ec_connector.domain import cache
from ec_connector.domain.blocks import Extent, ExtentAllocator
from ec_connector.domain.cache import EntryTable
from ec_connector.domain.entries import Phase
from ec_connector.domain.errors import AllocatorCorruption, IllegalTransition, UnknownEntry

# EC_FUZZ_EXAMPLES (the fuzz suite's long-run budget, docs/reliability.md) raises the budget here too.
SETTINGS = settings(
    max_examples=int(os.environ.get("EC_FUZZ_EXAMPLES") or 250),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _blocks(extents) -> list[int]:
    return [b for e in extents for b in range(e.start, e.end)]


def _assert_maximal(free: tuple[Extent, ...]) -> None:
    for a, b in zip(free, free[1:], strict=False):
        assert a.end < b.start, f"free extents {a} and {b} touch or overlap"


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
            assert set(_blocks(got)) <= set(_blocks(free_before))
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
        owned_blocks = [b for ext in owned for b in _blocks(ext)]
        free_blocks = _blocks(alloc.free_extents())
        assert len(owned_blocks) == len(set(owned_blocks)), "a block is owned twice"
        assert sorted(owned_blocks + free_blocks) == list(range(num_blocks)), "a block was lost"
        assert alloc.free_blocks == len(free_blocks) == num_blocks - alloc.used_blocks
        _assert_maximal(alloc.free_extents())


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
    owned = [b for e in table.entries() for b in _blocks(e.extents)]
    free = _blocks(table.blocks.free_extents())
    assert len(owned) == len(set(owned)), "two entries share a block"
    assert sorted(owned + free) == list(range(NUM_BLOCKS)), "blocks lost or invented"
    assert table.blocks.free_blocks == model.free
    _assert_maximal(table.blocks.free_extents())


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


entry_kinds = st.sampled_from(
    ["ready", "ready", "ready", "pinned", "granted", "announced", "not_ready", "quarantined"]
)


@SETTINGS
@given(
    specs=st.lists(st.tuples(st.integers(1, 4), entry_kinds), min_size=1, max_size=16),
    rows=st.integers(1, 40),
)
def test_eviction_takes_the_oldest_evictable_entries_and_no_more(specs, rows):
    table = EntryTable(40)
    evictable: list[tuple[str, int]] = []
    for i, (size, kind) in enumerate(specs):
        key = f"k{i}"
        if size > table.blocks.free_blocks:
            break  # setting up must not evict
        table.reserve(key, size, now=0.0, lease_s=100.0)
        if kind == "quarantined":
            table.quarantine(key, now=0.0, quarantine_s=100.0)
        elif kind != "not_ready":
            table.mark_ready(key)
        if kind == "pinned":
            table.pin(key)
        elif kind == "granted":
            table.grant(key, i, now=0.0, lease_s=100.0)
        elif kind == "announced":
            table.announce(key, now=0.0, lease_s=100.0)
        elif kind == "ready":
            evictable.append((key, size))
    keys_before = [e.key for e in table.entries()]
    free = table.blocks.free_blocks
    res = table.reserve("new", rows, now=1.0, lease_s=100.0)
    if rows > free + sum(size for _, size in evictable):
        assert res is None
        assert [e.key for e in table.entries()] == keys_before
        assert table.blocks.free_blocks == free
        return
    expected: list[str] = []
    for key, size in evictable:
        if rows <= free:
            break
        expected.append(key)
        free += size
    assert res is not None
    assert [e.key for e in res.evicted] == expected
    assert [e.key for e in table.entries()] == [k for k in keys_before if k not in expected] + ["new"]


@SETTINGS
@given(
    sizes=st.lists(st.integers(1, 4), min_size=2, max_size=10),
    reads=st.lists(st.tuples(st.integers(0, 9), st.sampled_from(["load", "peer"])), max_size=12),
    rows=st.integers(1, 40),
)
def test_an_entry_read_is_evicted_after_every_entry_not_read_since(sizes, reads, rows):
    """The eviction queue: reservation order, an entry moved to the back when a load (pin) or a
    peer's READ (grant) of it ends."""
    table = EntryTable(40)
    queue = [f"k{i}" for i in range(len(sizes))]
    for key, size in zip(queue, sizes, strict=True):
        table.reserve(key, size, now=0.0, lease_s=100.0)
        table.mark_ready(key)
    for n, (i, how) in enumerate(reads):
        key = f"k{i % len(sizes)}"
        if how == "load":
            table.pin(key)
            table.unpin(key)
        else:
            table.grant(key, n, now=0.0, lease_s=100.0)
            assert table.release_grant(key, n)
        queue.remove(key)
        queue.append(key)
    free = table.blocks.free_blocks
    res = table.reserve("new", rows, now=1.0, lease_s=100.0)
    if rows > free + sum(sizes):
        assert res is None
        return
    expected: list[str] = []
    for key in queue:
        if rows <= free:
            break
        expected.append(key)
        free += sizes[int(key[1:])]
    assert res is not None and [e.key for e in res.evicted] == expected
