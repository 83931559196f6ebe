"""The pressure workload's fill and the hit ratios expected from a replay of its own requests
(serving_workload.auto_fill, serving_expected), and the report's expected-beside-measured line."""

from __future__ import annotations

import argparse

import pytest

from ec_connector.benchmarks import serving_report
from ec_connector.benchmarks.serving import parser, plan_fill, workloads
from ec_connector.benchmarks.serving_expected import expected, hit_ratios
from ec_connector.benchmarks.serving_workload import build, fleet_workloads

ITEM = 768 * 3584 * 2  # 5.25 MiB: 768 blocks of 7 KiB
MiB = 1 << 20
A, B, C = 1, 2, 3


def _pressure(region: int, **kw: int) -> tuple:
    wl = build("pressure", (896, 672), requests=64, passes=2, item_bytes=ITEM, region_bytes=region, **kw)
    return wl, wl.passes[0].seeds


def test_the_auto_fill_stops_at_the_request_that_names_three_regions_of_distinct_images() -> None:
    wl, fill = _pressure(128 * MiB)  # the region holds 24 images, the pool 98
    assert wl.notes["region_images"] == 24 and wl.pool == 98
    assert len(set(fill)) == 72 == wl.notes["distinct_before_measured"]
    assert len(set(fill[:-1])) == 71  # not one request longer than needed
    assert wl.notes["fill_requests"] == len(fill) and wl.notes["fill_rule"] == "auto: 72 distinct images"
    assert [(p.label, p.measured, len(p.seeds)) for p in wl.passes[1:]] == [
        ("pass1", True, 64),
        ("pass2", True, 64),
    ]
    # a given fill draws the same requests from the same numbers: auto's length gives auto's trace
    given, _ = _pressure(128 * MiB, pressure_fill=len(fill))
    assert given.passes == wl.passes and given.notes["fill_rule"] == "given"
    short, short_fill = _pressure(128 * MiB, pressure_fill=64)
    assert short_fill == fill[:64] and short.notes["fill_requests"] == 64


def test_a_pool_too_small_for_three_regions_fills_three_quarters_of_it() -> None:
    wl, fill = _pressure(128 * MiB, pressure_pool=40)
    assert len(set(fill)) == 30 == wl.notes["distinct_before_measured"]


def test_the_fleet_fill_counts_the_fleets_total_region() -> None:
    _, pressure = fleet_workloads(
        (896, 672), region_bytes=2 * 128 * MiB, requests=64, passes=1, item_bytes=ITEM
    )
    assert pressure.name == "fleet-pressure" and pressure.notes["distinct_before_measured"] == 3 * 48


def test_a_cyclic_scan_one_image_larger_than_the_region_never_hits_in_fifo_and_half_in_belady() -> None:
    # region of 2 images, A B C over and over; the first 3 requests fill. FIFO (and S3-FIFO and
    # duel, which have nothing hit twice to keep) always evicts the next one asked; Belady keeps it
    # every other request: hit A, miss B, hit C, miss A, hit B, miss C
    assert hit_ratios([A, B, C] * 3, 3, 768, 2 * 768) == {
        "fifo": 0.0,
        "s3fifo": 0.0,
        "duel": 0.0,
        "belady": 0.5,
    }
    assert hit_ratios([A, B] * 3, 2, 768, 2 * 768) == {"fifo": 1.0, "s3fifo": 1.0, "duel": 1.0, "belady": 1.0}
    # only the measured requests count: the fill's misses are not in the ratio
    assert hit_ratios([A, B, A, B], 0, 768, 2 * 768)["fifo"] == 0.5


def test_per_replica_ratios_follow_the_round_robin_client() -> None:
    def passes(*ps: list[int]) -> dict:
        return {"passes": [{"seeds": p, "measured": n > 0} for n, p in enumerate(ps)]}

    # each replica's region holds one image: A always to replica 0, B to 1 -> every repeat hits
    same = expected(passes([A, B], [A, B]), ITEM, 2 * ITEM, replicas=2)
    assert same["expected_hit_ratio_per_replica"] == {"fifo": 1.0, "s3fifo": 1.0, "duel": 1.0}
    # swapped, each replica gets the image the other saw: no hit, where one region of both has all
    swapped = expected(passes([A, B], [B, A]), ITEM, 2 * ITEM, replicas=2)
    assert swapped["expected_hit_ratio"] == {"fifo": 1.0, "s3fifo": 1.0, "duel": 1.0, "belady": 1.0}
    assert swapped["expected_hit_ratio_per_replica"] == {"fifo": 0.0, "s3fifo": 0.0, "duel": 0.0}
    assert "expected_hit_ratio_per_replica" not in expected(passes([A], [A]), ITEM, ITEM)


def test_the_pair_pulling_from_each_other_hits_what_the_other_replica_holds() -> None:
    def passes(*ps: list[int]) -> dict:
        return {"passes": [{"seeds": p, "measured": n > 0} for n, p in enumerate(ps)]}

    # two images a replica: each measured request names the image the other replica encoded
    swapped = expected(passes([A, B], [B, A]), ITEM, 4 * ITEM, replicas=2)
    assert swapped["expected_hit_ratio_per_replica"]["duel"] == 0.0
    assert swapped["default_eviction"] == "duel"
    assert swapped["expected_hit_ratio_fleet"] == {"duel": 1.0}  # both pulled
    # a third image only replica 0 ever sees: encoded there, no peer holds it
    fresh = expected(passes([A, B], [B, C]), ITEM, 4 * ITEM, replicas=2)
    assert fresh["expected_hit_ratio_fleet"] == {"duel": 0.5}
    # a pull is a copy that needs room: with one image a replica, pulling B in replica 0 evicts A
    # there, so A's later request on replica 1 finds no holder and encodes
    tight = expected(passes([A, B], [B, A]), ITEM, 2 * ITEM, replicas=2)
    assert tight["expected_hit_ratio_fleet"] == {"duel": 0.5}
    assert "expected_hit_ratio_fleet" not in expected(passes([A], [A]), ITEM, ITEM)


def test_the_replay_serves_what_the_engine_served_before_so_s3fifos_kept_reads_count() -> None:
    def passes(*ps: list[int]) -> dict:
        return {"passes": [{"seeds": p, "measured": n > 0} for n, p in enumerate(ps)]}

    X, Y = 10, 11
    before = passes([X, Y], [X, Y], [Y, X])  # a repeat workload: X and Y read twice each
    cycle = passes([A, B, C, A, B, C, A, B], [A, B, C, A, B, C])
    fresh = expected(cycle, ITEM, 3 * ITEM)
    assert fresh["expected_hit_ratio"] == {"fifo": 1.0, "s3fifo": 1.0, "duel": 1.0, "belady": 1.0}
    assert "expected_after_requests" not in fresh
    # in a region of three images X and Y, read before, hold S3-FIFO's main queue: A, B and C
    # take turns in the one place left, never read there; FIFO has long let X and Y go, and so
    # has duel: its LRU shadow hits the cycle that its LFU order (X and Y counted most) misses
    after = expected(cycle, ITEM, 3 * ITEM, history=[(before, ITEM)])
    assert after["expected_hit_ratio"] == {"fifo": 1.0, "s3fifo": 0.0, "duel": 1.0, "belady": 1.0}
    assert after["expected_after_requests"] == 6
    assert "(after the engine's 6 requests of the workloads before)" in plan_fill(
        {**after, "fill_requests": 8, "fill_rule": "given", "distinct_before_measured": 3}
    )
    # the history's items count with their own size: a history of half-size items leaves room
    half = expected(cycle, ITEM, 3 * ITEM, history=[(before, ITEM // 2)])
    assert half["expected_hit_ratio"]["s3fifo"] > 0.0


def test_a_replay_of_requests_and_sizes_of_different_lengths_is_refused() -> None:
    with pytest.raises(ValueError, match="2 sizes for 3 requests"):
        hit_ratios([A, B, C], 0, [768, 768], 4 * 768)


def test_the_run_records_the_fill_and_the_expected_ratios_in_the_workload_notes() -> None:
    args = parser().parse_args(
        ["run", "--out", "/tmp/unused", "--workloads", "unique,pressure", "--region-mib", "64"]
    )
    geometry = {"hidden": 3584, "min_pixels": 3136, "max_pixels": 12845056}
    unique, pressure = workloads(args, geometry)
    assert "expected_hit_ratio" not in unique["notes"]
    notes = pressure["notes"]
    assert notes["fill_requests"] == len(pressure["passes"][0]["seeds"]) and notes["region_images"] == 12
    exp = notes["expected_hit_ratio"]
    assert set(exp) == {"fifo", "s3fifo", "duel", "belady"} and 0.0 < exp["fifo"] <= exp["belady"] <= 1.0
    line = plan_fill(notes)
    assert line.startswith(f"fill {notes['fill_requests']} requests (auto: 36 distinct images), 36 distinct")
    assert f"belady {exp['belady']:.3f}" in line
    # the engine serves unique first: the replay of pressure serves its requests before the fill
    assert notes["expected_after_requests"] == sum(len(p["seeds"]) for p in unique["passes"])
    repeat, fleet = workloads(argparse.Namespace(**{**vars(args), "workloads": "fleet"}), geometry)
    assert fleet["notes"]["expected_after_requests"] == sum(len(p["seeds"]) for p in repeat["passes"]) > 0
    assert fleet["notes"]["distinct_before_measured"] == 72  # 3x the fleet's 24 images
    assert set(fleet["notes"]["expected_hit_ratio_per_replica"]) == {"fifo", "s3fifo", "duel"}
    assert "a region per replica: fifo" in plan_fill(fleet["notes"])


def _engine(arm: str, r: int, hit: float, key: str) -> dict:
    measured = {"wall_s": 2.0, "req_s": 32.0, "hit_ratio": hit}
    return {
        "arm": arm,
        "round": r,
        "status": "ok",
        "workloads": [{"workload": key.split("@")[0], "key": key, "measured": measured}],
    }


def test_the_report_prints_measured_beside_expected_hit_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    exp = {"fifo": 0.56, "s3fifo": 0.62, "belady": 0.74}
    single = {
        "run_id": "t",
        "mode": "eager",
        "workloads": [{"name": "pressure", "size": [896, 672], "notes": {"expected_hit_ratio": exp}}],
        "engines": [
            _engine("none", 0, 0.1, "pressure@896x672"),
            _engine("upstream", 0, 0.58, "pressure@896x672"),
            _engine("ours", 0, 0.60, "pressure@896x672"),
            _engine("ours", 1, 0.64, "pressure@896x672"),
        ],
    }
    per = {"fifo": 0.41, "s3fifo": 0.53}
    fleet = {
        "run_id": "f",
        "mode": "eager",
        "workloads": [
            {
                "name": "fleet-pressure",
                "size": [896, 672],
                "notes": {"expected_hit_ratio": exp, "expected_hit_ratio_per_replica": per},
            }
        ],
        "engines": [
            _engine(a, 0, h, "fleet-pressure@896x672")
            for a, h in (("upstream", 0.4), ("local", 0.5), ("fleet", 0.57), ("single", 0.6))
        ],
    }
    serving_report.print_report([single, fleet])
    out = capsys.readouterr().out
    assert (
        "hit ratio measured / expected from a replay in our table: none 0.10 (vLLM's own encoder cache), "
        "upstream 0.58 / 0.56 (fifo), ours 0.62 / 0.62 (s3fifo); belady (offline) 0.74"
    ) in out
    assert (
        "upstream 0.40 / 0.41 (fifo a region per replica), local 0.50 / 0.53 (s3fifo a region per replica), "
        "fleet 0.57 / 0.53-0.62 (s3fifo, a region each - one region), single 0.60 / 0.62 (s3fifo)"
    ) in out
    # a run that replayed the pair pulling from each other prints that expectation for the fleet
    fleet["run_id"] = "g"
    fleet["workloads"][0]["notes"]["expected_hit_ratio_fleet"] = {"s3fifo": 0.59}
    serving_report.print_report([fleet])
    assert "fleet 0.57 / 0.59 (s3fifo pulling), single 0.60 / 0.62 (s3fifo)" in capsys.readouterr().out
    # runs before `default_eviction` was recorded ran s3fifo (above); a run that records it is
    # reported against its default
    single["run_id"] = "h"
    single["workloads"][0]["notes"] = {
        "expected_hit_ratio": {**exp, "duel": 0.65},
        "default_eviction": "duel",
    }
    serving_report.print_report([single])
    assert "upstream 0.58 / 0.56 (fifo), ours 0.62 / 0.65 (duel)" in capsys.readouterr().out


def test_ours_eviction_from_ours_extra_is_replayed_and_reported_beside_ours() -> None:
    args = parser().parse_args(
        [
            "run",
            "--out",
            "/tmp/unused",
            "--workloads",
            "pressure",
            "--region-mib",
            "64",
            "--ours-extra",
            '{"ec_eviction": "lecar"}',
        ]
    )
    geometry = {"hidden": 3584, "min_pixels": 3136, "max_pixels": 12845056}
    notes = workloads(args, geometry)[0]["notes"]
    exp = notes["expected_hit_ratio"]
    assert list(exp) == ["fifo", "s3fifo", "duel", "lecar", "belady"] and notes["ours_eviction"] == "lecar"
    assert 0.0 < exp["lecar"] <= exp["belady"]
    arms = {"ours": {"hit_ratio": {0: 0.5}}, "upstream": {"hit_ratio": {0: 0.25}}}
    line = serving_report.expected_line("pressure@896x672", notes, arms)
    assert line is not None
    assert (
        f"ours 0.50 / {exp['lecar']:.2f} (lecar)" in line
        and f"upstream 0.25 / {exp['fifo']:.2f} (fifo)" in line
    )


def test_a_fleet_run_with_ours_extra_replays_its_arms_with_that_policy() -> None:
    # the fleet's arms run ours' connector config, so their expectations are of its eviction
    args = parser().parse_args(
        ["run", "--out", "/tmp/unused", "--workloads", "fleet-pressure", "--region-mib", "64"]
    )
    geometry = {"hidden": 3584, "min_pixels": 3136, "max_pixels": 12845056}
    default = workloads(args, geometry)[0]["notes"]
    ours = workloads(
        argparse.Namespace(**{**vars(args), "ours_extra": {"ec_eviction": "lecar"}}), geometry
    )[0]["notes"]
    assert list(default["expected_hit_ratio_fleet"]) == ["duel"]
    assert list(ours["expected_hit_ratio_fleet"]) == ["lecar"] and ours["ours_eviction"] == "lecar"
    assert list(ours["expected_hit_ratio_per_replica"]) == ["fifo", "s3fifo", "duel", "lecar"]
    arms = {a: {"hit_ratio": {0: 0.5}} for a in ("upstream", "local", "fleet", "single")}
    line = serving_report.expected_line("fleet-pressure@896x672", ours, arms)
    assert line is not None
    per, pair, whole = (
        ours["expected_hit_ratio_per_replica"],
        ours["expected_hit_ratio_fleet"],
        ours["expected_hit_ratio"],
    )
    assert (
        f"upstream 0.50 / {per['fifo']:.2f} (fifo a region per replica), "
        f"local 0.50 / {per['lecar']:.2f} (lecar a region per replica), "
        f"fleet 0.50 / {pair['lecar']:.2f} (lecar pulling), single 0.50 / {whole['lecar']:.2f} (lecar)"
    ) in line


def test_the_pass_line_gives_what_the_encoded_items_alone_are_worth() -> None:
    # passes on an exact line of 1.0 s + 10 ms an item: the fit finds it, and the pairs' ratios
    # are those of the line at their mean items a pass
    points = {
        "none": [(50, 1.5), (54, 1.54)],
        "upstream": [(30, 1.3), (26, 1.26)],
        "ours": [(20, 1.2), (16, 1.16)],
        "single": [(0, 9.9)],  # a different layout in fleet mode; not an arm of a single-engine fit
    }
    line = serving_report.pass_line("pressure@896x672", points)
    assert line is not None
    assert "(6 measured passes of none, upstream, ours): 1.000 s + 10.0 ms an item (scatter 0.000 s)" in line
    assert f"ours / upstream {1.28 / 1.18:.2f}x, ours / none {1.52 / 1.18:.2f}x" in line
    # fleet rows fit the two-replica arms only, and compare fleet with local and upstream
    fleet = {
        "upstream": [(40, 1.8), (30, 1.7)],
        "local": [(36, 1.76)],
        "fleet": [(20, 1.6)],
        "single": [(0, 0.1)],
    }
    line = serving_report.pass_line("fleet-pressure@896x672", fleet)
    assert line is not None and "of upstream, local, fleet): 1.400 s + 10.0 ms" in line
    assert f"fleet / local {1.76 / 1.6:.2f}x" in line
    # items that never vary (every arm encodes every item) have no line
    every = {"none": [(64, 2.0)], "ours": [(64, 2.1)], "upstream": [(64, 2.0)]}
    assert serving_report.pass_line("unique@896x672", every) is None


def test_the_report_sums_ours_tier_counters_over_the_measured_passes() -> None:
    def engine(arm: str, r: int, counters: dict[str, int] | None) -> dict:
        passes = [
            {"label": "fill", "measured": False, "counters": {"misses": 500}},
            {"label": "pass1", "measured": True, **({"counters": counters} if counters is not None else {})},
            {"label": "pass2", "measured": True, **({"counters": counters} if counters is not None else {})},
        ]
        workload = {"workload": "fleet-pressure", "key": "fleet-pressure@896x672", "passes": passes}
        return {"arm": arm, "round": r, "status": "ok", "workloads": [workload]}

    run = {
        "run_id": "c",
        "mode": "eager",
        "engines": [
            engine("local", 0, {"hits": 20, "misses": 12, "misses_saving": 3, "evictions": 9}),
            engine("local", 1, {"hits": 22, "misses": 10, "misses_saving": 1, "evictions": 8}),
            engine("upstream", 0, None),  # vLLM's connector: no tier counters of ours
            engine("fleet", 0, {"fleet_pulls_done": 4}),  # pull counters alone: not a tier record
        ],
    }
    lines = serving_report.counter_lines([run])
    assert lines == {
        ("eager", "fleet-pressure@896x672"): [
            "local: hits 84, misses 44, misses_saving 8, saves_failed 0, not_offloaded 0, evictions 34"
        ]
    }
