"""Property tests of the entry table's eviction: the oldest evictable entries and no more, and an
entry read goes behind every entry not read since."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ec_connector.domain.cache import EntryTable
from ec_connector.domain.eviction_duel import DuelPolicy
from ec_connector.domain.eviction_lecar import LeCarPolicy
from tests.unit.property_checks import SETTINGS

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


# --- `lecar` and `duel`: holding to one order, their victims are that order's plain model -------

lecar_ops = st.lists(
    st.tuples(st.sampled_from(["new", "read"]), st.integers(0, 30), st.integers(1, 3)), max_size=60
)


@SETTINGS
@given(
    ops=lecar_ops,
    expert=st.sampled_from(["lru", "lfu"]),
    policy=st.sampled_from(["lecar", "duel"]),
    burst_run=st.integers(2, 6),
)
def test_lecar_and_duel_holding_to_one_order_evict_as_its_reference_model(ops, expert, policy, burst_run):
    """`lecar` with learning rate 0 and no floor under the weights holds its weight, `duel` with
    an infinite `z` never turns: at LRU every victim is the least recently listed or read, at LFU
    the one of fewest reservations + reads, counting those of an evicted key's earlier stays while
    the ghost (4x the region's blocks, oldest dropped first) remembers it (among equals the one
    whose count last changed first). `duel` takes first the entries of a burst not read since, in
    the order they were marked: `burst_run` (small here, so runs happen) or more reservations of
    keys not in the ghost with no read between. Counts are never halved here (the trace is shorter
    than the aging period)."""
    table = EntryTable(12)
    if policy == "lecar":
        weight = 1.0 if expert == "lru" else 0.0
        table._policy = LeCarPolicy(
            12, table._evictable, learning_rate=0.0, lru_weight=weight, min_weight=0.0, age=1000.0
        )
    else:
        duel = DuelPolicy(12, table._evictable, z=float("inf"), burst_run=burst_run)
        if expert == "lru":
            duel._turn()
        assert duel.follows_lru == (expert == "lru")
        table._policy = duel
    clock = 0
    last: dict[str, int] = {}  # key -> when listed first or read last (both experts' tie order)
    counts: dict[str, int] = {}  # key -> reservations + reads, kept after eviction (the ghost)
    rows_of: dict[str, int] = {}
    ghost: dict[str, int] = {}  # evicted key -> rows, oldest first
    run: list[str] = []  # duel: the current run of reservations of keys not in the ghost
    marked: dict[str, None] = {}  # duel: a burst's entries not read since, in marking order
    for n, (op, k, rows) in enumerate(ops):
        clock += 1
        if op == "read":
            live = sorted(rows_of)
            if not live:
                continue
            key = live[k % len(live)]
            table.pin(key)
            table.unpin(key)
            counts[key] += 1
            last[key] = clock
            run.clear()
            marked.pop(key, None)
            continue
        key = f"k{k % 8}"  # an evicted key may come back: its count goes on from the ghost
        if key in rows_of:
            key = f"n{n}"
        free = table.blocks.free_blocks
        order = sorted(rows_of, key=lambda x: (last[x],) if expert == "lru" else (counts[x], last[x]))
        if policy == "duel":
            order = list(marked) + [x for x in order if x not in marked]
        expected = []
        for victim in order:
            if rows <= free:
                break
            expected.append(victim)
            free += rows_of[victim]
        res = table.reserve(key, rows, now=0.0, lease_s=100.0)
        assert res is not None
        assert [e.key for e in res.evicted] == expected
        for victim in expected:
            ghost[victim] = rows_of.pop(victim)
            marked.pop(victim, None)
            while sum(ghost.values()) > 4 * 12:
                dropped = next(iter(ghost))
                del ghost[dropped], counts[dropped]
        table.mark_ready(key)
        rows_of[key] = rows
        if key in ghost:
            del ghost[key]
            run.clear()
        elif policy == "duel":
            run.append(key)
            if len(run) >= burst_run:  # the run's keys still held, then each later one as it comes
                marked.update(dict.fromkeys(k for k in run[-burst_run:] if k in rows_of))
        counts[key] = counts.get(key, 0) + 1
        last[key] = clock
