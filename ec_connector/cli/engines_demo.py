"""`ec-connector demo`: the README's main demo, on real vLLM engines.

Runs the two example programs of the source checkout with an interpreter that has vLLM (this one if
it can import vllm, else the checkout's `.venv-vllm`): `examples/local_tier_engine.py` (one `ec_both`
engine reloading repeated images from the /dev/shm tier) and `examples/e_pd_orchestrator.py` (an
encoder-only producer server and a consumer server, encodings pulled over NIXL).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

from ec_connector.domain.errors import ECConnectorError

PARTS = {
    "local": "local_tier_engine.py",
    "p2p": "e_pd_orchestrator.py",
}


def run_engines_demo(args: argparse.Namespace) -> int:
    root = Path(__file__).resolve().parents[2]
    examples = root / "examples"
    if not examples.is_dir():
        raise ECConnectorError(
            f"the real-engine demo runs the examples of a source checkout and found none at {examples}; "
            "run it from a clone of the repository, or run `ec-connector demo --synthetic`"
        )
    python = _vllm_python(root, args.vllm_python)
    for part in args.parts or list(PARTS):
        print(f"== ec-connector demo: {part} ({python} examples/{PARTS[part]})", flush=True)
        code = subprocess.call([str(python), str(examples / PARTS[part])], cwd=root)
        if code != 0:
            print(f"ec-connector demo: {PARTS[part]} failed with exit code {code}", file=sys.stderr)
            return 1
    return 0


def _vllm_python(root: Path, given: str | None) -> Path:
    if given:
        python = Path(given)
        if not python.exists():
            raise ECConnectorError(f"--vllm-python {given}: no such file")
        return python
    if importlib.util.find_spec("vllm") is not None:
        return Path(sys.executable)
    python = root / ".venv-vllm" / "bin" / "python"
    if python.exists():
        return python
    raise ECConnectorError(
        "the real-engine demo needs vLLM: run `make demo` (it builds .venv-vllm with vLLM's CPU build), "
        "pass --vllm-python, or run `ec-connector demo --synthetic` (no vLLM)"
    )
