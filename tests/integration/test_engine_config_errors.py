"""A rejected configuration stops a real vLLM engine at start, with the documented message."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from .test_local_tier_engine import ENGINE_DIR

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

START = r"""
import json, sys
from vllm import LLM
LLM(model=sys.argv[1], distributed_executor_backend="uni", dtype="bfloat16", max_model_len=256,
    enforce_eager=True, ec_transfer_config=json.loads(sys.argv[2]))
print("ENGINE STARTED")
"""


def start(python: Path, model: Path, config: dict, extra_path: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1")
    if extra_path is not None:
        env["PYTHONPATH"] = str(extra_path)
    proc = subprocess.run(
        [str(python), "-c", START, str(model), json.dumps(config)],
        env=env,
        cwd=ENGINE_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "ENGINE STARTED" not in proc.stdout, "the engine must not start"
    return proc.stdout + proc.stderr


def config(**changes: object) -> dict:
    base = {
        "ec_connector": "ECTierConnector",
        "ec_connector_module_path": "ec_connector.entrypoints.vllm",
        "ec_role": "ec_both",
        "ec_connector_extra_config": {"ec_cpu_bytes": 1 << 20},
    }
    base.update(changes)
    return base


def test_missing_ec_cpu_bytes_fails_at_start_naming_the_key(vllm_python, tiny_vlm_dir):
    out = start(vllm_python, tiny_vlm_dir, config(ec_connector_extra_config={}))
    assert (
        "ec_connector_extra_config is missing required key 'ec_cpu_bytes': expected a positive "
        'integer number of bytes, e.g. {"ec_cpu_bytes": 1073741824}'
    ) in out


def test_a_wrong_role_fails_at_start_naming_it(vllm_python, tiny_vlm_dir):
    out = start(vllm_python, tiny_vlm_dir, config(ec_role="ec_sender"))
    assert "ec_sender" in out and "ec_role" in out


def test_nixl_requested_but_not_importable_fails_with_the_exact_message(vllm_python, tiny_vlm_dir, tmp_path):
    # A `nixl` that cannot be imported, ahead of the installed one on the path.
    broken = tmp_path / "nixl"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('nixl is not installed here')\n")
    extra = {"ec_cpu_bytes": 1 << 20, "ec_enable_nixl": "yes"}
    out = start(vllm_python, tiny_vlm_dir, config(ec_connector_extra_config=extra), extra_path=tmp_path)
    assert (
        "RuntimeError: ec_enable_nixl requires NIXL; install the nixl package or remove "
        "ec_enable_nixl from ec_connector_extra_config."
    ) in out
