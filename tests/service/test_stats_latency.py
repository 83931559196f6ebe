"""Copy latencies the scheduler side records for the connector's histograms (issue #6)."""

from __future__ import annotations

from ec_connector.application.stats import SAMPLE_LIMIT, Samples, TierStats

from .conftest import Engine


def test_save_and_load_latencies_span_plan_to_completion_on_every_rank():
    eng = Engine(ranks=2, hold=True)
    eng.step([("img-a", 3)])
    eng.clock.advance(0.25)
    eng.settle()
    eng.step([("img-a", 3)])
    eng.clock.advance(0.5)
    eng.copiers[0].release_held()
    eng.workers[0].flush()
    eng.scheduler.poll()
    assert "load" not in eng.scheduler.stats.latencies.take(), "rank 1 has not finished its load"
    eng.clock.advance(0.125)
    eng.copiers[1].release_held()
    eng.workers[1].flush()
    eng.scheduler.poll()
    assert eng.scheduler.stats.latencies.take() == {"load": [0.625]}


def test_save_latency_is_taken_once():
    eng = Engine(hold=True)
    eng.step([("img-a", 2), ("img-b", 1)])
    eng.clock.advance(0.75)
    eng.settle()
    assert eng.scheduler.stats.latencies.take() == {"save": [0.75, 0.75]}
    assert eng.scheduler.stats.latencies.take() == {}


def test_failed_copies_record_no_latency():
    eng = Engine()
    eng.scheduler.on_allocated("img-a", 2)
    plan = eng.scheduler.take_plan()
    eng.workers[0].bind(plan)
    eng.workers[0].clear()  # the planned save never came: reported failed
    eng.scheduler.poll()
    assert eng.scheduler.stats.saves_failed == 1
    assert eng.scheduler.stats.latencies.take() == {}


def test_counters_exclude_latencies_and_samples_are_bounded():
    stats = TierStats()
    assert "latencies" not in stats.as_dict() and all(isinstance(v, int) for v in stats.as_dict().values())
    samples = Samples()
    for _ in range(SAMPLE_LIMIT + 3):
        samples.observe("save", 0.001)
    samples.observe("load", -1.0)  # a clock never runs backwards; a negative value is clamped
    taken = samples.take()
    assert len(taken["save"]) == SAMPLE_LIMIT and samples.dropped == 3
    assert taken["load"] == [0.0]
