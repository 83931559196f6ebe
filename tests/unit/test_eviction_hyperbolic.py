"""The `hyperbolic`, `decayed` and `lecar-tuned` candidates of the eviction bench
(bench/eviction_hyperbolic.py, bench/eviction_decayed.py): they keep the table's guarantees
(tests/unit/test_eviction_offline.py) and their victims are those of plain reference
models that recompute every priority from the whole request history."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.eviction import _ours
from bench.eviction_decayed import AdaptiveDecayedPolicy, ClimbingDecayedPolicy, DecayedPolicy
from bench.eviction_hyperbolic import HyperbolicPolicy, is_candidate, make_candidate
from ec_connector.domain.cache import EntryTable
from ec_connector.domain.entries import Entry, Extent
from ec_connector.domain.eviction import EvictionPolicy
from ec_connector.domain.eviction_lecar import LeCarPolicy
from tests.unit.table_helpers import LEASE, request


def test_a_sample_of_held_entries_still_finds_the_one_evictable_entry():
    table = EntryTable(8)
    policy = HyperbolicPolicy(8, table._evictable, sample=1)
    table._policy = policy
    for n in range(8):
        request(table, f"k{n}")
    for n in range(1, 8):
        table.pin(f"k{n}")
    res = table.reserve("new", 1, now=0.0, lease_s=LEASE)
    assert res is not None and [e.key for e in res.evicted] == ["k0"]


def test_the_bench_replays_the_candidates_by_name():
    for name in ("hyperbolic:k=16,size=1,ghost=2,horizon=4,prior=1,seed=3", "decayed:half=2", "lecar-tuned"):
        assert is_candidate(name)
        side = _ours(name)(64)
        assert type(side.table._policy).__name__ in ("HyperbolicPolicy", "DecayedPolicy", "LeCarPolicy")
    assert not is_candidate("lecar") and not is_candidate("s3fifo")
    with pytest.raises(ValueError, match="expected k=v"):
        make_candidate("hyperbolic:nope=1", 8, {})
    with pytest.raises(ValueError, match="is not a number"):
        make_candidate("decayed:half=x", 8, {})


# --- victims against reference models ------------------------------------------------------------


class _Model:
    """A region of `capacity` blocks that, on a miss that does not fit, evicts the resident key of
    lowest `score(key, now)` (ties: the one requested longest ago), recomputing every score from
    the whole request history (evicted keys' history kept: the candidates' ghosts are large)."""

    def __init__(self, capacity: int, score: Callable[[_Model, str], float]) -> None:
        self.capacity = capacity
        self.score = score
        self.rows: dict[str, int] = {}
        self.history: dict[str, list[int]] = {}  # key -> clock at each request
        self.admitted: dict[str, int] = {}  # key -> clock at its first request
        self.clock = 0

    def request(self, key: str, rows: int, *, tick: int = 1) -> list[str]:
        out: list[str] = []
        if key not in self.rows:
            while sum(self.rows.values()) + rows > self.capacity:
                victim = min(self.rows, key=lambda k: (self.score(self, k), self.history[k][-1]))
                del self.rows[victim]
                out.append(victim)
            self.rows[key] = rows
            self.admitted.setdefault(key, self.clock + tick)
        self.clock += tick
        self.history.setdefault(key, []).append(self.clock)
        return out


def _hyperbolic_score(size_aware: bool) -> Callable[[_Model, str], float]:
    def score(model: _Model, key: str) -> float:
        # the policy's own arithmetic (count / (age x rows)), so that equal rates tie exactly in both
        age = model.clock - model.admitted[key] + 1
        return len(model.history[key]) / (age * model.rows[key] if size_aware else age)

    return score


def _replay(table: EntryTable, trace: list[tuple[str, int]]) -> list[list[str]]:
    out = []
    for key, rows in trace:
        if key in table:
            request(table, key)
            out.append([])
        else:
            res = table.reserve(key, rows, now=0.0, lease_s=LEASE)
            assert res is not None
            table.mark_ready(key)
            out.append([e.key for e in res.evicted])
    return out


HAND = [(k, 1) for k in "aaabbcdaeabfcagbbahcaibj"]


@pytest.mark.parametrize("size_aware", [False, True])
def test_hyperbolic_evicts_the_lowest_rate_as_a_plain_model_does(size_aware):
    trace = HAND if not size_aware else [(k, 1 + ord(k) % 3) for k, _ in HAND]
    table = EntryTable(5)
    table._policy = HyperbolicPolicy(
        5, table._evictable, sample=512, size_aware=size_aware, ghost_share=100, prior=0.0
    )
    model = _Model(5, _hyperbolic_score(size_aware))
    expected = [model.request(k, r) for k, r in trace]
    assert _replay(table, trace) == expected
    assert any(expected)


def test_hyperbolic_on_the_hand_trace_keeps_the_keys_read_often():
    table = EntryTable(4)
    table._policy = HyperbolicPolicy(4, table._evictable, sample=512, prior=0.0)
    evicted = [k for ks in _replay(table, [(k, 1) for k in "aaaaaabbbcde"]) for k in ks]
    # at "e" (11 accesses): a 6/11, b 3/5, c 1/2, d 1/1: c has the lowest rate
    assert evicted == ["c"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=st.lists(st.integers(0, 9), min_size=1, max_size=120), size_aware=st.booleans())
def test_hyperbolic_matches_the_model_on_random_traces(keys, size_aware):
    trace = [(f"k{k}", 1 + k % 3 if size_aware else 1) for k in keys]
    table = EntryTable(8)
    table._policy = HyperbolicPolicy(
        8, table._evictable, sample=2048, size_aware=size_aware, ghost_share=100, prior=0.0
    )
    model = _Model(8, _hyperbolic_score(size_aware))
    assert _replay(table, trace) == [model.request(k, r) for k, r in trace]


def test_hyperbolic_restores_an_evicted_keys_count_and_admission_from_its_ghost():
    table = EntryTable(2)
    policy = HyperbolicPolicy(2, table._evictable, sample=512, prior=0.0)
    table._policy = policy
    for key in "aaab":
        request(table, key)
    request(table, "c")  # a: 3/4 against b: 1/1 -> a goes, with count 3 and admission 1
    assert "a" not in table
    request(table, "a")  # b: 1/2 against c: 1/1 -> b goes; a comes back with 4 requests in 6
    assert "b" not in table
    assert policy.priority(table._entries["a"]) == pytest.approx(4 / 6)


def test_the_horizon_scales_an_old_entrys_count_down_and_keeps_its_rate():
    table = EntryTable(4)
    policy = HyperbolicPolicy(4, table._evictable, sample=512, horizon=1.0, prior=0.0)
    table._policy = policy
    for key in "abcd":
        request(table, key)
    for _ in range(20):
        request(table, "d")
    request(table, "a")  # "a": 2 requests in 25 accesses, past the horizon of 4 entries
    node = policy._nodes["a"]
    assert node.count == pytest.approx(2 * 4 / 25)
    assert policy._time - node.since + 1 == 4


def _decayed_score(lam: float, size_aware: bool) -> Callable[[_Model, str], float]:
    def score(model: _Model, key: str) -> float:
        s = sum(2.0 ** (-lam * (model.clock - t)) for t in model.history[key])
        return s / model.rows[key] if size_aware else s

    return score


@pytest.mark.parametrize("half_life", [0.25, 1.0, 8.0])
def test_decayed_evicts_the_lowest_decayed_count_as_a_plain_model_does(half_life):
    table = EntryTable(5)
    table._policy = DecayedPolicy(5, table._evictable, half_life=half_life, ghost_share=100)
    lam = 1.0 / (half_life * 5)
    model = _Model(5, _decayed_score(lam, False))
    expected = [model.request(k, r, tick=r) for k, r in HAND]
    assert _replay(table, HAND) == expected
    assert any(expected)


def test_a_short_half_life_is_lru_and_a_long_one_lfu():
    trace = [(k, 1) for k in "aaaabcd"] + [("e", 1)]
    for half_life, gone in ((0.05, "a"), (100.0, "b")):
        table = EntryTable(4)
        table._policy = DecayedPolicy(4, table._evictable, half_life=half_life)
        assert _replay(table, trace)[-1] == [gone]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    keys=st.lists(st.integers(0, 9), min_size=1, max_size=120),
    half_life=st.sampled_from([0.3, 1.0, 4.0]),
    size_aware=st.booleans(),
)
def test_decayed_victims_have_the_lowest_score_on_random_traces(keys, half_life, size_aware):
    """Each victim's score (recomputed from its whole history) is the lowest resident's, to rounding."""
    table = EntryTable(8)
    table._policy = DecayedPolicy(
        8, table._evictable, half_life=half_life, ghost_share=100, size_aware=size_aware
    )
    score = _decayed_score(1.0 / (half_life * 8), size_aware)
    model = _Model(8, score)
    for k in keys:
        key, rows = f"k{k}", 1 + k % 3
        if key in table:
            request(table, key)
        else:
            res = table.reserve(key, rows, now=0.0, lease_s=LEASE)
            assert res is not None
            table.mark_ready(key)
            for victim in res.evicted:
                lowest = min(score(model, r) for r in model.rows)
                assert math.isclose(score(model, victim.key), lowest, rel_tol=1e-9)
                del model.rows[victim.key]
            model.rows[key] = rows
            model.admitted.setdefault(key, model.clock + rows)
        model.clock += rows
        model.history.setdefault(key, []).append(model.clock)


def test_adaptive_decayed_with_one_half_life_is_decayed():
    keys = [(n * n + 3 * n) % 23 for n in range(400)]
    trace = [(f"k{k}", 1 + k % 2) for k in keys]
    fixed, adaptive = EntryTable(16), EntryTable(16)
    fixed._policy = DecayedPolicy(16, fixed._evictable, half_life=2.0)
    adaptive._policy = AdaptiveDecayedPolicy(16, adaptive._evictable, half_lives=(2.0,))
    assert _replay(fixed, trace) == _replay(adaptive, trace)


def test_adaptive_decayed_feeds_its_shadows_a_shard_of_the_keys():
    table = EntryTable(64)
    policy = AdaptiveDecayedPolicy(64, table._evictable, shard=0.25)
    table._policy = policy
    keys = [f"k{n}" for n in range(400)]
    for key in keys:
        request(table, key)
    fed = {k for shadow in policy._shadows for k in (*shadow.resident, *shadow.ghost)}
    assert fed < set(keys)
    assert 0.15 < len(fed) / len(keys) < 0.35
    assert all(shadow.capacity == 16 for shadow in policy._shadows)


def _adaptive_after(trace: list[str], start: int, z: float = 0.0) -> float:
    """The half-life followed after `trace`, starting from `half_lives[start]` (0.25 or 64)."""
    table = EntryTable(4)
    policy = AdaptiveDecayedPolicy(4, table._evictable, half_lives=(0.25, 64.0), window=1.0, start=start, z=z)
    table._policy = policy
    _replay(table, [(k, 1) for k in trace])
    return policy.half_life


def test_adaptive_decayed_follows_recency_when_the_hot_keys_change():
    old = list("abcd") * 20
    new = list("efgh") * 30
    assert _adaptive_after(old + new, start=1) == 0.25
    assert _adaptive_after(old + new, start=1, z=2.0) == 0.25  # the gain is far beyond its noise
    assert _adaptive_after(old + new, start=1, z=100.0) == 64.0  # never enough evidence


def test_adaptive_decayed_follows_frequency_when_one_offs_come_between_hot_keys():
    trace = [k for n in range(60) for k in ("a", f"x{n}", "b", f"y{n}", "c", f"z{n}")]
    assert _adaptive_after(trace, start=0) == 64.0


def _climber(capacity: int = 4, **kw: object) -> tuple[EntryTable, ClimbingDecayedPolicy]:
    table = EntryTable(capacity)
    policy = ClimbingDecayedPolicy(capacity, table._evictable, **kw)  # type: ignore[arg-type]
    table._policy = policy
    return table, policy


def test_a_climber_with_one_half_life_is_decayed():
    keys = [(n * n + 3 * n) % 23 for n in range(400)]
    trace = [(f"k{k}", 1 + k % 2) for k in keys]
    fixed = EntryTable(16)
    fixed._policy = DecayedPolicy(16, fixed._evictable, half_life=2.0)
    climbing, _ = _climber(16, half_lives=(2.0,), sample=0.5)
    assert _replay(fixed, trace) == _replay(climbing, trace)


def test_a_climber_steps_once_a_sample_and_turns_when_its_hit_ratio_drops():
    _, policy = _climber(4, half_lives=(0.25, 1.0, 4.0, 16.0), sample=2.0)  # no entries: 2 a sample
    seen = Entry("x", (Extent(0, 1),), 1, 0.0)  # the climber counts requests; which entry does not matter
    path = []
    for hits in ([True, True], [True, False], [False, True], [False, False], [True, True]):
        for hit in hits:
            policy._requested(seen, hit=hit)
        path.append(policy.half_life)
    # 1.0 first: one step shorter; 0.5 below it: back; 0.5 again: on, and turned at the grid's end;
    # 0.0 below: back; 1.0: on, turned at the end again
    assert path == [4.0, 16.0, 4.0, 16.0, 4.0]


def test_a_climber_re_keys_to_its_new_half_life():
    table, policy = _climber(8, half_lives=(0.25, 64.0), sample=0.5)
    for n in range(40):
        _replay(table, [(f"k{n % 6}", 1)])
    lam = 1.0 / (policy.half_life * 8)
    assert policy._lam == lam
    for node in policy._nodes.values():
        assert math.isclose(node.key, math.log2(node.score) + lam * node.when)


# --- lecar-tuned ---------------------------------------------------------------------------------


def _victims_of(policy_of: Callable[[EntryTable], EvictionPolicy], keys: list[int]) -> list[list[str]]:
    table = EntryTable(16)
    table._policy = policy_of(table)
    return _replay(table, [(f"k{k}", 1 + k % 2) for k in keys])


def test_lecar_tuned_with_the_shipped_discount_is_lecar():
    keys = [(n * n + 3 * n) % 23 for n in range(400)]
    assert _victims_of(lambda t: make_candidate("lecar-tuned", 16, t._evictable), keys) == _victims_of(
        lambda t: LeCarPolicy(16, t._evictable), keys
    )


def test_lecar_tuned_a_gentler_discount_moves_the_weight_more_for_a_late_regret():
    moved = []
    for discount in (0.005, 0.5):
        table = EntryTable(16)
        policy = LeCarPolicy(16, table._evictable, discount=discount)
        table._policy = policy
        for i in range(10):
            request(table, f"x{i}")  # ten entries held
        policy._regret(0, 30)  # the LRU expert's victim came back 30 accesses later
        moved.append(0.5 - policy.lru_weight)
    assert 0 < moved[0] < moved[1]


def test_the_step_cost_bench_times_each_policy_against_the_first() -> None:
    from bench.eviction_step_cost import step_costs

    res = step_costs(
        ["fifo", "decayed-adaptive"], trace_name="compare", steps=40, reps=1, region_gib=0.01, seed=3
    )
    assert set(res) == {"fifo", "decayed-adaptive"} and res["fifo"]["p50_ratio"] == 1.0
    assert all(0 < r["p50_us"] <= r["p99_us"] for r in res.values())
