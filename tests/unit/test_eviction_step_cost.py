"""bench/eviction_step_cost.py's split of a replay's time: the policy, timed through a wrapper,
decides as it does unwrapped, and the two parts add up to the replay."""

from __future__ import annotations

import pytest

from bench.cache_traces import make_trace
from bench.eviction import _ours
from bench.eviction_step_cost import _TimedPolicy, policy_split
from ec_connector.benchmarks.compare_cache import replay


@pytest.mark.parametrize("policy", ["fifo", "duel"])
def test_a_timed_policy_decides_as_the_policy_does(policy):
    num_blocks = 4_000
    trace = make_trace(steps=80, live=32, num_blocks=num_blocks, seed=3, source="compare")
    plain, wrapped = _ours(policy)(num_blocks), _ours(policy)(num_blocks)
    timed = _TimedPolicy(wrapped.table._policy)
    wrapped.table._policy = timed
    replay(plain, trace)
    replay(wrapped, trace)
    assert timed.spent > 0
    assert {e.key for e in plain.table.entries()} == {e.key for e in wrapped.table.entries()}
    assert plain.table.blocks.free_blocks == wrapped.table.blocks.free_blocks


def test_the_split_adds_up_to_the_replay():
    split = policy_split(["fifo", "duel"], trace_name="compare", steps=60, reps=2, region_gib=0.02, seed=3)
    for figures in split.values():
        assert 0 < figures["policy_ms"] < figures["total_ms"]
        assert figures["table_ms"] == pytest.approx(figures["total_ms"] - figures["policy_ms"])
