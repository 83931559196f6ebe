"""vLLM's OpenAI server with ECTierConnector: image chats answered, `vllm:ec_tier_*` on /metrics.

`python -m vllm.entrypoints.openai.api_server` serves the tiny random-weight model (eager, the
default runner) with the connector given by `--ec-transfer-config` and its module path, and
vLLM's own encoder cache cut to one item (`--ec-manager-config`). Chat requests with base64 PNG
images, each image requested again after others pushed it out of vLLM's cache, must come back
200 OK, and /metrics must count the tier's hits, loads and saves.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.chat_requests import chat_body, free_port, png

from .conftest import Target
from .harness import engine_env, post_json, region_files, scrape, serving

SIZES = [(100, 80), (112, 112), (84, 112), (98, 98)]  # 12-16 image tokens: one fills vLLM's 16 rows
WORKLOAD = [0, 1, 0, 2, 1, 3, 0, 2]  # one image per request; every repeat follows another image
START_LIMIT_S = 300
SMALL_CACHE = {
    "encoder_cache_manager_cls": "suite_engine.SmallEncoderCache",
    "manager_config": {"cache_size": 16},
}


def value(metrics: dict, name: str, **labels: str) -> float:
    """The one sample `name` with `labels` (and model_name="tiny")."""
    want = {"model_name": "tiny", **labels}
    found = [v for (n, ls), v in metrics.items() if n == name and all((k, w) in ls for k, w in want.items())]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples on /metrics"
    return found[0]


@pytest.fixture(scope="module")
def server(target: Target, tiny_vlm_dir: Path, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("openai_server")
    port = free_port()
    engine_id = f"gpu-srv-{uuid.uuid4().hex[:6]}"
    config = {
        "ec_connector": "ECTierConnector",
        "ec_connector_module_path": "ec_connector.entrypoints.vllm",
        "ec_role": "ec_both",
        "engine_id": engine_id,
        "ec_connector_extra_config": {"ec_cpu_bytes": 1 << 20},
    }
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_vlm_dir),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "bfloat16", "--max-model-len", "512", "--max-num-seqs", "2", "--seed", "0",
        "--enforce-eager", "--no-enable-prefix-caching", "--limit-mm-per-prompt", json.dumps({"image": 1}),
        "--ec-transfer-config", json.dumps(config), "--ec-manager-config", json.dumps(SMALL_CACHE),
    ]  # fmt: skip
    if target.device == "cuda":
        cmd += ["--gpu-memory-utilization", "0.2"]
    env = engine_env(target.device, "v2", single_process=False)
    answers = []
    with serving(cmd, env, work / "server.log", port, START_LIMIT_S * target.slowdown):
        for i in WORKLOAD:
            answers.append(
                post_json(f"http://127.0.0.1:{port}/v1/chat/completions", chat_body(png(i, SIZES[i])))
            )
        # the hits are counted in the steps that scheduled the repeats; give the last stats a moment
        deadline = time.monotonic() + 10
        while True:
            metrics = scrape(f"http://127.0.0.1:{port}/metrics")
            hits = [v for (n, _), v in metrics.items() if n == "vllm:ec_tier_hits_total"]
            if (hits and hits[0] > 0) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    shown = {
        n + str(sorted(k for k in ls if k[0] not in ("model_name", "engine"))): v
        for (n, ls), v in metrics.items()
        if n.startswith("vllm:ec_tier") and not n.endswith(("_created", "_bucket")) and v
    }
    print(f"\n/metrics after {len(WORKLOAD)} requests: {json.dumps(shown, indent=1)}")
    return {"answers": answers, "metrics": metrics, "engine_id": engine_id}


def test_an_image_chat_request_is_answered(server):
    for status, body in server["answers"]:
        assert status == 200
        assert body["usage"]["completion_tokens"] == 4
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["prompt_tokens"] > 10  # the image's placeholder tokens are in the prompt


def test_metrics_count_the_tiers_hits_after_repeats(server):
    m = server["metrics"]
    distinct = len(set(WORKLOAD))
    repeats = len(WORKLOAD) - distinct
    hits = value(m, "vllm:ec_tier_hits_total")
    assert 0 < hits <= repeats
    assert value(m, "vllm:ec_tier_loads_total") == hits
    assert value(m, "vllm:ec_tier_saves_total") >= distinct - 1
    assert value(m, "vllm:ec_tier_misses_total") >= distinct
    assert value(m, "vllm:ec_tier_copy_bytes_total", direction="load") > 0
    assert value(m, "vllm:ec_tier_entries") > 0


def test_the_region_file_is_gone_after_the_server_stopped(server):
    assert region_files(server["engine_id"]) == []
