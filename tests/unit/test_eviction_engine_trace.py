"""The engine-shaped traces of the eviction sweep (cache_traces.ENGINE_SOURCES): the serving
bench's pressure workload at length, replayed as the serving bench's expected hit ratios are."""

from __future__ import annotations

import pytest

from bench.eviction import _ours
from ec_connector.benchmarks.cache_traces import (
    ENGINE_DRIFT_EVERY,
    ENGINE_ROWS,
    ENGINE_SIZE,
    ENGINE_SOURCES,
    ROW_BYTES,
    SWAP_POOL,
    SWAP_ROUNDS,
    Trace,
    engine_requests,
    make_trace,
)
from ec_connector.benchmarks.replay import replay_hits
from ec_connector.benchmarks.serving_expected import hit_ratios
from ec_connector.benchmarks.serving_workload import build


@pytest.mark.parametrize("source", (*ENGINE_SOURCES, "engine-swap"))
def test_one_request_a_step_one_768_row_image_each_and_no_failed_save(source):
    trace = make_trace(steps=300, live=256, num_blocks=0, seed=4, source=source, pool=60)
    assert len(trace.steps) == 300
    assert all(len(step.arrivals) == 1 and len(step.arrivals[0][1]) == 1 for step in trace.steps)
    items = trace.items()
    assert {item.rows for item in items} == {ENGINE_ROWS}
    assert not any(item.fails for item in items)
    assert len({item.key for item in items}) <= 60 + (SWAP_POOL if source == "engine-swap" else 0)
    assert (
        trace.items() == make_trace(steps=300, live=1, num_blocks=0, seed=4, source=source, pool=60).items()
    )


def test_a_stationary_engine_trace_is_the_serving_benchs_pressure_workload():
    steps, pool = 400, 80
    item_bytes = ENGINE_ROWS * ROW_BYTES
    wl = build(
        "pressure",
        ENGINE_SIZE,
        requests=steps - steps // 4,
        passes=1,
        item_bytes=item_bytes,
        region_bytes=pool * item_bytes // 4,
        pressure_pool=pool,
        pressure_fill=steps // 4,
        zipf=0.8,
        seed=2,
    )
    assert engine_requests(steps=steps, source="engine0.8", seed=2, pool=pool) == [
        s for p in wl.passes for s in p.seeds
    ]


def test_the_drifting_trace_moves_its_most_requested_images_at_each_re_ranking():
    requests = engine_requests(steps=4 * ENGINE_DRIFT_EVERY, source="engine-drift", seed=1, pool=200)
    tops = []
    for k in range(4):
        period = requests[k * ENGINE_DRIFT_EVERY : (k + 1) * ENGINE_DRIFT_EVERY]
        counts = sorted(((period.count(i), i) for i in set(period)), reverse=True)
        tops.append({i for _, i in counts[:10]})
    for a, b in zip(tops, tops[1:], strict=False):
        assert len(a & b) <= 4  # a fresh ranking: at most a few of the top ten stay on top


def test_the_swap_trace_serves_the_repeat_pool_rounds_then_zipf_over_other_images():
    rankings: list = []
    requests = engine_requests(steps=1000, source="engine-swap", seed=2, pool=120, rankings=rankings)
    first, rest = requests[: SWAP_POOL * SWAP_ROUNDS], requests[SWAP_POOL * SWAP_ROUNDS :]
    assert len(requests) == 1000 and not set(first) & set(rest)
    for k in range(SWAP_ROUNDS):  # each round a shuffle of the whole pool
        assert len(set(first[k * SWAP_POOL : (k + 1) * SWAP_POOL])) == SWAP_POOL
    assert rest == engine_requests(steps=len(rest), source="engine0.8", seed=2, pool=120)
    assert [(start, alpha, len(keys)) for start, alpha, keys in rankings] == [
        (0, 0.0, SWAP_POOL),
        (SWAP_POOL * SWAP_ROUNDS, 0.8, 120),
    ]
    assert engine_requests(steps=100, source="engine-swap", seed=2) == first[:100]


@pytest.mark.parametrize("policy", ["fifo", "s3fifo", "lecar", "duel"])
def test_the_sweeps_replay_of_an_engine_trace_is_the_serving_benchs_expected_hit_ratio(policy):
    requests = engine_requests(steps=500, source="engine1.0", seed=6, pool=100)
    num_blocks = 25 * ENGINE_ROWS
    trace = make_trace(steps=500, live=1, num_blocks=0, seed=6, source="engine1.0", pool=100)
    swept = replay_hits(_ours(policy)(num_blocks), Trace(trace.steps, 1, num_blocks, "engine1.0"))
    expected = hit_ratios(requests, 0, ENGINE_ROWS, num_blocks, (policy,))
    assert 1.0 - swept["miss_ratio"] == pytest.approx(expected[policy])
    assert expected["belady"] >= expected[policy]


def test_an_unknown_engine_trace_is_refused():
    with pytest.raises(ValueError, match="engine0.6"):
        engine_requests(steps=10, source="engine0.7")


def test_an_s3fifo_variant_by_settings_replays_like_the_shipped_policy_with_those_shares():
    trace = make_trace(steps=300, live=0, num_blocks=0, source="engine0.8")
    blocks = trace.footprint_rows() // 5
    sized = Trace(trace.steps, trace.live, blocks, trace.name)
    same = replay_hits(_ours("s3fifo:small=0.1,ghost=0.4,reads=7")(blocks), sized)
    assert same["misses"] == replay_hits(_ours("s3fifo")(blocks), sized)["misses"]
    other = replay_hits(_ours("s3fifo:small=0.3")(blocks), sized)
    assert other["misses"] != same["misses"]
    for bad, says in (("s3fifo:tiny=0.1", "k one of"), ("s3fifo:small=x", "small='x' is not a number")):
        with pytest.raises(ValueError, match=says):
            _ours(bad)
