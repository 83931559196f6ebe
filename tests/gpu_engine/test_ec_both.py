"""`ec_both` in a real vLLM engine: outputs, encoder runs and the region, per runner and mode.

For each model runner (V2, vLLM 0.33's default; V1 with VLLM_USE_V2_MODEL_RUNNER=0) and mode
(eager; compiled: torch.compile + CUDA graphs), two single-process engines serve the same workload
of repeated images, one request at a time, prefix caching off:
- with ECTierConnector (`ec_both`) and vLLM's own encoder cache cut to 16 rows, one image (every
  image here is 9-16 tokens), so every repeat must come back from the connector's tier;
- without a connector and with vLLM's own cache at its default size, so it encodes each image
  once, in the same single-image first requests as the connector's engine: its outputs are what the
  tier's reloads must reproduce bit for bit (two images encoded in one batch need not give the same
  bits on a GPU as each alone, so the reference never re-encodes).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from .conftest import Target
from .harness import engine_env, region_files, run_driver

IMAGES = 8
# 16 requests over 8 distinct images: each seen again, never in the next request; one twice in a request
WORKLOAD = [[0], [1], [2], [3], [4], [5], [6], [7], [3], [0, 5], [7], [1], [6, 2], [4], [0], [5, 5]]
DISTINCT = len({i for request in WORKLOAD for i in request})
REPEATS = sum(len(set(r) & {i for earlier in WORKLOAD[:n] for i in earlier}) for n, r in enumerate(WORKLOAD))
ENGINE_CACHE_ROWS = 16  # the connector engine's own encoder cache: the largest image (16 tokens), no more
REPEAT_SLACK = 1  # re-encodes allowed beyond one per distinct image (a save not done when its repeat came)
ENGINE_LIMIT_S = {"eager": 240, "compiled": 420}  # start + 16 requests + shutdown, per engine

CASES = [
    pytest.param(("v2", "eager"), id="v2-eager"),
    pytest.param(("v2", "compiled"), id="v2-compiled"),
    pytest.param(("v1", "eager"), id="v1-eager"),
    pytest.param(("v1", "compiled"), id="v1-compiled"),
]


def connector(engine_id: str) -> dict:
    return {
        "ec_connector": "ECTierConnector",
        "ec_connector_module_path": "ec_connector.entrypoints.vllm",
        "ec_role": "ec_both",
        "engine_id": engine_id,
        "ec_connector_extra_config": {"ec_cpu_bytes": 1 << 20},
    }


def run_engine(target: Target, model: Path, work: Path, runner: str, mode: str, config: dict | None) -> dict:
    name = f"{runner}-{mode}-{'tier' if config else 'plain'}"
    spec = {
        "device": target.device,
        "eager": mode == "eager",
        "gpu_memory_utilization": 0.2,
        "connector": config,
        "engine_cache_rows": ENGINE_CACHE_ROWS if config else 0,
        "images": IMAGES,
        "workload": WORKLOAD,
    }
    (work / f"{name}.spec.json").write_text(json.dumps(spec))
    out = work / f"{name}.json"
    run_driver(
        "local.py",
        [str(model), str(out), str(work / f"{name}.spec.json")],
        engine_env(target.device, runner),
        work / f"{name}.log",
        ENGINE_LIMIT_S[mode] * target.slowdown,
    )
    return json.loads(out.read_text())


@pytest.fixture(scope="module", params=CASES)
def case(request, target: Target, tiny_vlm_dir: Path, tmp_path_factory) -> dict:
    runner, mode = request.param
    if target.device == "cpu" and (runner == "v2" or mode == "compiled"):
        pytest.skip(f"{runner}/{mode} needs CUDA: on the CPU build only the V1 runner, eager, is checked")
    work = tmp_path_factory.mktemp(f"ec_both-{runner}-{mode}")
    engine_id = f"gpu-both-{uuid.uuid4().hex[:6]}"
    plain = run_engine(target, tiny_vlm_dir, work, runner, mode, None)
    tier = run_engine(target, tiny_vlm_dir, work, runner, mode, connector(engine_id))
    print(f"\n{runner}/{mode}: {json.dumps({'plain': plain['engine'], 'tier': tier['engine']})}")
    print(
        f"{runner}/{mode}: encoder runs {len(tier['encoded'])} with the tier (one-item vLLM cache), "
        f"{len(plain['encoded'])} without (default cache); start {tier['start_s']:.1f} s / "
        f"{plain['start_s']:.1f} s; serve {tier['serve_s']:.2f} s / {plain['serve_s']:.2f} s; "
        f"stats {json.dumps(tier['stats'])}"
    )
    return {
        "runner": runner,
        "mode": mode,
        "plain": plain,
        "tier": tier,
        "engine_id": engine_id,
        "target": target,
    }


def test_the_engines_run_the_runner_and_mode_asked_for(case):
    for report in (case["plain"], case["tier"]):
        engine = report["engine"]
        assert engine["enforce_eager"] is (case["mode"] == "eager")
        if case["target"].device == "cuda":
            v2 = engine["runner"].startswith("vllm.v1.worker.gpu.")
            assert v2 is (case["runner"] == "v2"), engine["runner"]


def test_tokens_are_identical_to_the_same_engine_without_a_connector(case):
    tier, plain = case["tier"]["requests"], case["plain"]["requests"]
    assert [r["token_ids"] for r in tier] == [r["token_ids"] for r in plain]
    assert all(r["finish_reason"] == "length" and len(r["token_ids"]) == 6 for r in tier)
    # the reference encoded each image once: its outputs are those of single-image encodes
    assert sorted(case["plain"]["encoded"]) == sorted(set(case["plain"]["encoded"]))
    assert len(case["plain"]["encoded"]) == DISTINCT


def test_the_encoder_runs_about_once_per_distinct_image_and_repeats_come_from_the_tier(case):
    tier = case["tier"]
    assert len(set(tier["encoded"])) == DISTINCT
    assert DISTINCT <= len(tier["encoded"]) <= DISTINCT + REPEAT_SLACK, tier["encoded"]
    stats = tier["stats"]
    assert stats.get("loads_done", 0) >= REPEATS - REPEAT_SLACK
    assert stats.get("hits", 0) >= stats.get("loads_done", 0)
    assert stats.get("saves_done", 0) >= DISTINCT
    assert stats.get("loads_failed", 0) == stats.get("saves_failed", 0) == 0


def test_the_region_file_is_gone_after_shutdown(case):
    assert region_files(case["engine_id"]) == []
