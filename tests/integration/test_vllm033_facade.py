"""The vLLM facade against vLLM 0.33's scheduler side, on a CPU machine, with no engine.

vLLM 0.33 ships only as a CUDA wheel; tools/setup_vllm033_overlay.sh unpacks its Python tree into
.venv-vllm033, which runs first on PYTHONPATH under .venv-vllm's python (torch CPU and the
dependencies 0.33's scheduler side imports) with VLLM_TARGET_DEVICE=cpu. The driver
(vllm033_facade_driver.py) runs vLLM 0.33's configs, ECConnectorFactory, plugin loader, Scheduler,
Request, multimodal processor, ECConnectorLogging and ECConnectorProm around ECTierConnector and
reports what happened; each test below checks one part. The model runner's side (encoding, the V2
runner) needs the GPU suite (docs/gpu-engine-suite.md). Skips without the overlay.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import REPO_ROOT

pytestmark = [pytest.mark.vllm]

OVERLAY = Path(os.environ.get("EC_VLLM033_OVERLAY", REPO_ROOT / ".venv-vllm033"))
OVERLAY_STAMP = ".ec_connector_overlay.stamp"  # written by tools/setup_vllm033_overlay.sh when it completes
DRIVER = Path(__file__).with_name("vllm033_facade_driver.py")
HIDDEN = 128  # the tiny model's row width (tools/tiny_vlm.py)


@pytest.fixture(scope="module")
def run(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The driver's report of one run (about 20 s alone on 2 cores, most of it importing vLLM)."""
    if not (OVERLAY / OVERLAY_STAMP).exists():
        pytest.skip(
            f"vLLM 0.33 overlay not found at {OVERLAY} (build it with tools/setup_vllm033_overlay.sh)"
        )
    model = tmp_path_factory.mktemp("tiny_qwen2_vl_config")
    base_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    made = subprocess.run(
        [str(vllm_python), str(REPO_ROOT / "tools" / "tiny_vlm.py"), str(model)],
        env=base_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr[-4000:]
    env = {
        **base_env,
        "PYTHONPATH": str(OVERLAY),
        "VLLM_TARGET_DEVICE": "cpu",  # a CUDA build finds no platform on a machine without a GPU
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    out = subprocess.run(
        [str(vllm_python), str(DRIVER), str(model), f"ci033-{os.getpid()}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-6000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_vllm_033_runs_from_the_overlay_on_the_cpu_platform_with_no_compiled_part(
    run: dict[str, Any],
) -> None:
    assert run["version"] == "0.33.0"
    assert Path(run["vllm_file"]).is_relative_to(OVERLAY)
    assert run["supported"]
    assert run["platform"] == "CpuPlatform"
    assert run["compiled_vllm_modules"] == []


def test_a_producer_whose_measured_widths_differ_from_the_row_is_refused_at_creation(
    run: dict[str, Any],
) -> None:
    assert run["widths_field"]  # 0.33's ECTransferConfig has the field compat.py reads
    assert run["widths_before"] == {}  # filled by vLLM only once it measured a producer's encoder
    assert run["refusal"] is not None
    assert "widths {'image': 64}" in run["refusal"]
    assert f"row width from the model config is {HIDDEN}" in run["refusal"]


def test_vllm_033s_plugin_loader_registers_the_connector_by_name(run: dict[str, Any]) -> None:
    assert run["by_plugin"] == "ec_connector.entrypoints.vllm.connector.ECTierConnector"


def test_a_nixl_producer_publishes_an_item_vllm_033s_processor_made_with_its_metadata(
    run: dict[str, Any],
) -> None:
    producer = run["producer"]
    rows = producer["rows"]
    assert producer["saves"] == [["image-p", rows]]
    assert producer["delay_free"] is False
    published = producer["params"]["image-p"]
    t, h, w = published["metadata"]["image_grid_thw"]  # what a consumer needs to place the rows
    assert t * h * w // 4 == rows  # Qwen2-VL merges 2x2 patches into one row
    assert published["size_bytes"] == rows * HIDDEN * 2  # bf16
    assert published["peer_port"] > 0


def test_vllm_033s_scheduler_loads_an_item_its_own_encoder_cache_evicted(run: dict[str, Any]) -> None:
    steps = run["steps"]
    first, *fillers, again, last = steps
    assert (first["identifier"], first["encoded"], first["saves"], first["loads"]) == (
        "image-a",
        [0],
        ["image-a"],
        [],
    )
    assert fillers and all(s["encoded"] == [0] and s["saves"] == [s["identifier"]] for s in fillers)
    # A is out of vLLM's encoder cache now: the tier has it, so vLLM schedules no encoder run for it
    assert again["identifier"] == "image-a"
    assert again["encoded"] == [] and again["saves"] == [] and again["loads"] == ["image-a"]
    assert again["loaded"] == {"image-a": True}  # the saved output, read back from the /dev/shm region
    assert last["encoded"] == [0] and last["saves"] == ["image-b"]
    # every request finishes; an ec_both instance without peers returns no transfer params
    assert [s["finished"] for s in steps] == [[f"req-{n}"] for n in range(len(steps))]
    assert all(s["ec_transfer_params"] == [None] for s in steps)
    calls = run["hook_calls"]
    for hook in ("ensure_cache_available", "has_cache_item", "update_state_after_alloc", "request_finished"):
        assert calls.get(hook) == len(steps), (hook, calls)
    assert calls.get("build_connector_meta") == len(steps)
    assert calls.get("get_ec_connector_stats", 0) >= len(steps)


def test_the_stats_pass_through_vllm_033s_logger_and_prometheus(run: dict[str, Any]) -> None:
    steps = len(run["steps"])
    assert len(run["stats"]) == steps  # one SchedulerStats.ec_connector_stats dict a step
    assert run["accumulated_type"] == "ECTierStats"  # ECConnectorLogging built ours and aggregated them
    reduced = run["reduced"]
    assert reduced["hits"] == 1 and reduced["misses"] == steps - 1
    assert reduced["saves_done"] == steps - 2  # B's save completes after its own step
    assert reduced["loads_done"] == 1
    assert reduced["save_count"] == reduced["saves_done"]
    assert run["log_lines"] == ["EC Transfer metrics: " + ", ".join(f"{k}={v}" for k, v in reduced.items())]
    assert run["prom_type"] == "ECTierPromMetrics"
    assert run["prom"]["vllm:ec_tier_hits_total"] == 1
    assert run["prom"]["vllm:ec_tier_loads_total"] == 1
