"""The eviction bench's offline references and candidates (bench/eviction_offline.py,
bench/eviction_candidates.py, bench/eviction_arc.py): the bound is below every policy's miss
ratio, Belady evicts the entry requested farthest ahead, and the candidates keep the table's
guarantees."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.cache_traces import Trace, make_trace
from bench.eviction import _belady, _ours, _popularity, _posterior, replay_hits
from bench.eviction_arc import ArcPolicy
from bench.eviction_block import BlockDuelPolicy, BlockLfuPolicy
from bench.eviction_block_buckets import bucket_classes
from bench.eviction_candidates import ClockPolicy, TinyLfuS3FifoPolicy
from bench.eviction_hyperbolic import make_candidate
from bench.eviction_offline import (
    BeladyPolicy,
    PopularityPolicy,
    PosteriorPolicy,
    RequestClock,
    TraceLaw,
    _knapsack,
    _knapsack_weighted,
    law_of,
    miss_ratio_bound,
    popularity_of,
    request_positions,
)
from bench.eviction_wtinylfu import WTinyLfuPolicy
from ec_connector.domain.cache import EntryTable
from ec_connector.domain.eviction import EvictionPolicy
from ec_connector.domain.eviction_lecar import LeCarPolicy, LfuPolicy
from tests.unit.test_eviction import check_blocks, reserve_checked, seed

LEASE = 100.0


@pytest.mark.parametrize("source", ["compare", "zipf0.6", "scan", "drift"])
@pytest.mark.parametrize("fraction", [0.05, 0.2])
def test_the_bound_is_at_most_every_policys_miss_ratio(source, fraction):
    probe = make_trace(steps=300, live=64, num_blocks=0, seed=3, source=source, pool=300)
    num_blocks = int(probe.footprint_rows() * fraction)
    trace = Trace(probe.steps, probe.live, num_blocks, source, probe.rankings)
    bound = miss_ratio_bound(trace, num_blocks)["miss_ratio"]
    policies = ("fifo", "s3fifo", "lfu", "lecar")
    ratios = {p: replay_hits(_ours(p)(num_blocks), trace)["miss_ratio"] for p in policies}
    clock = RequestClock()
    ratios["belady"] = replay_hits(_belady(num_blocks, request_positions(probe), clock), trace, clock)[
        "miss_ratio"
    ]
    if trace.rankings:
        clock = RequestClock()
        ratios["popularity"] = replay_hits(_popularity(num_blocks, trace, clock), trace, clock)["miss_ratio"]
    assert all(bound <= r + 1e-12 for r in ratios.values()), (bound, ratios)
    assert ratios["belady"] <= ratios["fifo"]


def test_the_bound_of_a_region_that_holds_everything_is_the_compulsory_misses():
    probe = make_trace(steps=200, live=32, num_blocks=0, seed=5, source="zipf0.8", pool=100)
    res = miss_ratio_bound(probe, probe.footprint_rows())
    assert res["max_hit_groups"] == res["groups"] - res["compulsory_groups"]
    assert res["miss_ratio"] == pytest.approx(
        res["compulsory_groups"] / (res["compulsory_groups"] + res["max_hit_requests"])
    )


def test_the_knapsacks_take_the_cheapest_hits_first_and_the_last_one_fractionally():
    assert _knapsack([1, 2, 3, 10], 6) == 3
    assert _knapsack([2, 4], 4) == 1.5
    assert _knapsack_weighted([(10, 1), (4, 2), (3, 3)], 9) == pytest.approx(5 + 0.2)


def test_belady_evicts_the_entry_requested_farthest_ahead():
    clock = RequestClock()
    positions = {"a": [0, 5], "b": [1, 9], "c": [2], "d": [3, 4]}
    table = EntryTable(30)
    table._policy = BeladyPolicy(table._evictable, positions, clock)
    for pos, key in enumerate("abc"):
        clock.pos = pos
        assert table.reserve(key, 10, now=0.0, lease_s=LEASE) is not None
        table.mark_ready(key)
    clock.pos = 3
    res = table.reserve("d", 10, now=0.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["c"]  # never requested again
    table.mark_ready("d")
    res = table.reserve("e", 10, now=0.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["b"]  # next at 9, "a" at 5, "d" at 4


def test_popularity_evicts_the_lowest_rate_per_block_of_the_current_regime():
    clock = RequestClock()
    # two regimes: "a" most popular then least; sizes 10 and 20 (per block: weight / rows)
    weights = [{"a": 1.0, "b": 0.5, "c": 0.25}, {"a": 0.1, "b": 0.5, "c": 1.0}]
    regimes = [0, 0, 0, 0, 1, 1]
    table = EntryTable(40)
    table._policy = PopularityPolicy(table._evictable, regimes, weights, clock)
    for pos, (key, rows) in enumerate([("a", 10), ("b", 10), ("c", 20)]):
        clock.pos = pos
        assert table.reserve(key, rows, now=0.0, lease_s=LEASE) is not None
        table.mark_ready(key)
    clock.pos = 3
    res = table.reserve("d", 10, now=0.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["c"]  # 0.25 / 20 is the lowest
    table.mark_ready("d")  # in no ranking: rate 0
    clock.pos = 4  # the second regime: "a" is the least popular now, "d" still has no rate
    res = table.reserve("e", 30, now=0.0, lease_s=LEASE)  # 10 blocks free: 20 more needed
    assert res is not None and [e.key for e in res.evicted] == ["d", "a"]


def test_posterior_evicts_the_lowest_posterior_mean_per_block_and_forgets_counts_at_a_new_regime():
    clock = RequestClock()
    # the requests, by position: "a" three times, "b" once, then a new regime where "c" is asked
    law = TraceLaw(("a", "a", "b", "a", "c", "c", "d", "e"), (0, 0, 0, 0, 1, 1, 1, 1), ((0.8, 50), (0.8, 50)))
    table = EntryTable(60)
    policy = PosteriorPolicy(table._evictable, law, clock)
    table._policy = policy
    for pos, key in ((1, "a"), (2, "b"), (3, "x")):  # "x" is never requested: n = 0
        clock.pos = pos
        assert table.reserve(key, 20, now=0.0, lease_s=LEASE) is not None
        table.mark_ready(key)
    assert policy.mean(0) < policy.mean(1) < policy.mean(3)  # more requests seen: more probable
    res = table.reserve("y", 20, now=0.0, lease_s=LEASE)  # full: the unrequested "x" goes
    assert res is not None and [e.key for e in res.evicted] == ["x"]
    table.mark_ready("y")  # requested 0 times too, and queued later than "b"
    res = table.reserve("z", 20, now=0.0, lease_s=LEASE)  # "y" (n = 0) before "b" (1) and "a" (3)
    assert res is not None and [e.key for e in res.evicted] == ["y"]
    table.mark_ready("z")
    clock.pos = 5  # the new regime: "a" and "b" count 0 now, "c" twice
    res = table.reserve("c", 20, now=0.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["a"]  # n = 0 all three: oldest first
    table.mark_ready("c")
    clock.pos = 6  # "d" (10 blocks): "b" goes, unrequested in this regime and older than "z"
    res = table.reserve("d", 10, now=0.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["b"]
    table.mark_ready("d")
    evictable = table._evictable
    assert (
        policy.score(evictable["d"]) == policy.mean(1) / 10
        and policy.score(evictable["c"]) == policy.mean(2) / 20
    )
    # per block: "d" (once, 10 blocks) goes before "c" (twice, 20 blocks), because a second request
    # more than doubles the posterior mean (a key seen once is most likely in the Zipf tail)
    assert policy.mean(2) > 2 * policy.mean(1)
    assert [e.key for e in policy.victims(30, protect=set())] == ["z", "d"]


def test_posterior_orders_equal_sizes_as_their_counts_in_the_regime():
    """For equal sizes the posterior mean rises with the count (the likelihood ratio is monotone),
    so the order is that of a plain count model: its victims equal the keys of fewest requests."""
    probe = make_trace(steps=300, live=32, num_blocks=0, seed=5, source="engine0.8", pool=60)
    law = law_of(probe)
    assert law is not None and law.zipf == ((0.8, 60),)
    rows = probe.items()[0].rows
    trace = Trace(probe.steps, probe.live, rows * 12, "engine0.8", probe.rankings)
    clock = RequestClock()
    side = _posterior(trace.num_blocks, law, clock)
    table, policy = side.table, side.table._policy
    counts: dict[str, int] = {}
    for pos, item in enumerate(trace.items()):
        clock.pos = pos
        counts[item.key] = counts.get(item.key, 0) + 1
        if item.key in table._evictable:  # a hit: every entry here is READY and unpinned
            continue
        expected = sorted(table._evictable.values(), key=lambda e: (counts.get(e.key, 0), e.order))
        res = table.reserve(item.key, item.rows, now=0.0, lease_s=LEASE)
        assert res is not None
        assert [e.key for e in res.evicted] == [e.key for e in expected[: len(res.evicted)]]
        table.mark_ready(item.key)
    assert [policy.mean(n) for n in range(5)] == sorted({policy.mean(n) for n in range(5)})


def test_posterior_needs_every_request_in_its_regimes_ranking():
    assert law_of(make_trace(steps=200, live=16, num_blocks=0, seed=1, source="scan", pool=100)) is None
    assert law_of(make_trace(steps=200, live=16, num_blocks=0, seed=1, source="compare")) is None
    drift = make_trace(steps=600, live=16, num_blocks=0, seed=1, source="drift", pool=100)
    law = law_of(drift)
    assert law is not None and law.zipf == ((0.8, 100), (0.8, 100))
    assert law.keys == tuple(item.key for item in drift.items()) and len(law.regimes) == len(law.keys)


@pytest.mark.parametrize("source", ["zipf0.8", "drift", "engine0.8", "engine-drift"])
def test_a_traces_rankings_are_its_generators_and_their_top_keys_are_requested_most(source):
    from bench.cache_traces import DRIFT_EVERY, ENGINE_DRIFT_EVERY

    probe = make_trace(steps=1200, live=64, num_blocks=0, seed=3, source=source, pool=200)
    starts = [first for first, _, _ in probe.rankings]
    every = {"drift": DRIFT_EVERY, "engine-drift": ENGINE_DRIFT_EVERY}.get(source)
    assert starts == (list(range(0, 1200, every)) if every else [0])
    keys = {item.key for item in probe.items()}
    assert all(keys <= set(ranking) for _, _, ranking in probe.rankings)  # every drawn key is ranked
    regimes, weights = popularity_of(probe)
    assert len(regimes) == len(probe.items()) and len(weights) == len(starts)
    # within each regime, its top-ranked keys are among the most requested (Zipf 0.8, 200 keys)
    for r, (_, _, ranking) in enumerate(probe.rankings):
        counts: dict[str, int] = {}
        for reg, item in zip(regimes, probe.items(), strict=True):
            if reg == r:
                counts[item.key] = counts.get(item.key, 0) + 1
        top = sorted(counts, key=lambda k: -counts[k])[:10]
        assert ranking[0] in top, (r, ranking[0], top)


# --- the candidates keep the table's guarantees -------------------------------------------------

CANDIDATES = [
    "clock",
    "s3fifo-tinylfu",
    "lfu",
    "lecar",
    "lecar-lru",
    "wtinylfu",
    "arc",
    "lfu-block",
    "duel-block",
    "lfu-bucket",
    "duel-bucket",
    "popularity",
    "posterior",
]
TUNED = [  # bench/eviction_hyperbolic.py and bench/eviction_decayed.py, with settings that exercise them
    "hyperbolic",
    "hyperbolic:prior=0,k=2",
    "hyperbolic:prior=4,horizon=2",
    "hyperbolic-size:ghost=0",
    "decayed:half=0.5",
    "decayed-size:ghost=0",
    "decayed-adaptive:window=0.5,halves=0.2/5",
    "decayed-adaptive:z=1,size=1,window=0.5,halves=0.2/5",
    "decayed-adaptive:z=0,shard=0.5,window=0.5,halves=0.2/5",
    "decayed-climb:sample=0.5,halves=0.2/1/5",
    "decayed-climb:sample=0.25,tolerance=0.1,size=1,start=0,halves=0.2/5",
    "lecar-tuned:discount=0.5,rate=0.9",
]
CANDIDATES += TUNED
KINDS = ["ready", "ready", "read", "pinned", "granted", "announced", "not_ready", "quarantined"]


def _candidate(name: str, table: EntryTable) -> EvictionPolicy:
    num_blocks = table.blocks.num_blocks
    if name in TUNED:
        return make_candidate(name, num_blocks, table._evictable)
    if name == "clock":
        return ClockPolicy(table._evictable)
    if name == "popularity":  # two regimes that rank the keys in opposite orders, the clock between
        keys = [f"k{i}" for i in range(20)] + [f"new{n}" for n in range(30)]
        weights = [
            {k: 1.0 / (i + 1) for i, k in enumerate(keys)},
            {k: 1.0 / (i + 1) for i, k in enumerate(keys[::-1])},
        ]
        clock = RequestClock()
        clock.pos = 1
        return PopularityPolicy(table._evictable, [0, 1], weights, clock)
    if name == "posterior":  # two regimes over the keys the test reserves, the clock in the second
        keys = tuple(f"k{i}" for i in range(20)) + tuple(f"new{n}" for n in range(30))
        clock = RequestClock()
        clock.pos = 30
        law = TraceLaw(keys + keys, (0,) * 50 + (1,) * 50, ((0.8, 50), (1.0, 50)))
        return PosteriorPolicy(table._evictable, law, clock)
    if name == "lfu":
        return LfuPolicy(num_blocks, table._evictable, age=0.05)  # ages often: the aging path runs
    if name.startswith("lecar"):  # no key comes back here, so the weights stay: "lecar-lru" starts
        # (and stays) with nearly every victim the LRU expert's, "lecar" alternates the two experts
        lru_weight = 0.99 if name == "lecar-lru" else 0.5
        return LeCarPolicy(num_blocks, table._evictable, age=0.05, history_share=0.5, lru_weight=lru_weight)
    if name == "lfu-block":  # ages often: the regroup runs
        return BlockLfuPolicy(num_blocks, table._evictable, age=0.05)
    if name == "duel-block":  # a turn every period or two: both shadows run
        return BlockDuelPolicy(num_blocks, table._evictable, z=0.0)
    if name == "lfu-bucket":  # two buckets an octave (ties between counts), ages often
        return bucket_classes(2)[0](num_blocks, table._evictable, age=0.05)
    if name == "duel-bucket":
        return bucket_classes()[1](num_blocks, table._evictable, z=0.0)
    if name == "arc":  # T1's target at half the region: victims come from both lists
        return ArcPolicy(num_blocks, table._evictable, p_start=0.5)
    if name == "wtinylfu":  # a window of a fifth, a sample of 64 requests: the climber moves it
        return WTinyLfuPolicy(num_blocks, table._evictable, window_share=0.2, sample=0.5)
    return TinyLfuS3FifoPolicy(num_blocks, table._evictable, min_compact=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(CANDIDATES),
    specs=st.lists(st.tuples(st.integers(1, 6), st.sampled_from(KINDS)), min_size=1, max_size=20),
    later=st.lists(
        st.tuples(st.integers(1, 20), st.frozensets(st.integers(0, 19), max_size=3), st.integers(0, 3)),
        max_size=30,
    ),
)
def test_no_candidate_evicts_a_held_entry_and_blocks_are_conserved(name, specs, later):
    table = EntryTable(40)
    table._policy = _candidate(name, table)
    held = seed(table, specs)
    for n, (rows, protect_ids, reads) in enumerate(later):
        if reserve_checked(table, f"new{n}", rows, held=held, protect={f"k{i}" for i in protect_ids}):
            for _ in range(reads):  # reads move entries between the candidates' queues
                table.pin(f"new{n}")
                table.unpin(f"new{n}")
                check_blocks(table)
    # lazy deletion stays bounded: stale heap or queue items are compacted away
    assert table._policy.queued() <= 2 * len(table.entries()) + 64


def test_the_sweep_replays_posterior_where_the_trace_has_a_law_and_not_elsewhere():
    from bench.eviction import run

    res = run(traces=("engine-drift", "scan", "drift"), policies=("fifo",), steps=600)
    drift = res["traces"]["engine-drift"]["by_fraction"]["0.10"]
    scan = res["traces"]["scan"]["by_fraction"]["0.10"]
    sized = res["traces"]["drift"]["by_fraction"]["0.10"]
    assert "posterior" in drift and "posterior" not in scan
    # per entry is a different order only where sizes differ
    assert "posterior-bytes" in sized and "posterior-bytes" not in drift
    assert sized["posterior-bytes"]["byte_miss_ratio"] < sized["posterior"]["byte_miss_ratio"]
    # it learns, so it misses less than fifo, and it does not know the order, so not below belady
    assert drift["belady"]["miss_ratio"] <= drift["posterior"]["miss_ratio"] < drift["fifo"]["miss_ratio"]
