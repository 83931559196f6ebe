"""`ec-connector demo`: the README's main demo, on real vLLM engines.

Runs the two example programs of the source checkout with an interpreter that has vLLM (this one if
it can import vllm, else the checkout's `.venv-vllm`): `examples/local_tier_engine.py` (one `ec_both`
engine reloading repeated images from the /dev/shm tier) and `examples/e_pd_orchestrator.py` (an
encoder-only producer server and a consumer server, encodings pulled over NIXL). The terminal gets
the demo's story; every engine's own output goes to a log file in one directory, named up front,
because vLLM's start-up warnings would otherwise be the first thing a newcomer reads.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from ec_connector.domain.errors import ECConnectorError

PARTS = {
    "local": (
        "local_tier_engine.py",
        "local tier: one engine (ec_both) whose own encoder cache holds a single image, as a busy "
        "server's would; repeated images come back from the connector's /dev/shm tier instead of the "
        "encoder",
        "local.log",
    ),
    "p2p": (
        "e_pd_orchestrator.py",
        "encoder -> prefill/decode: an encoder-only producer server and a consumer server; this "
        "script forwards each request's ec_transfer_params and the consumer pulls the encodings "
        "from the producer's region with a NIXL READ instead of encoding",
        "producer.log, consumer.log, orchestrator.log",
    ),
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
    parts = args.parts or list(PARTS)
    logs = Path(tempfile.mkdtemp(prefix="ec_demo_"))
    print("ec-connector demo: ECTierConnector inside real vLLM engines (CPU build), serving a tiny")
    print("random-weight Qwen2-VL written for the demo; each part starts its engines first (a minute")
    print("or more on a 2-core machine).")
    print(f"Engine logs: {logs}/ (the terminal shows the demo's own lines only)", flush=True)
    for n, part in enumerate(parts, 1):
        script, story, log_names = PARTS[part]
        print(f"\n[{n}/{len(parts)}] {textwrap.fill(story, 96, subsequent_indent='      ')}")
        print(f"      {python} examples/{script}; logs: {log_names}", flush=True)
        code = subprocess.call([str(python), str(examples / script), "--log-dir", str(logs)], cwd=root)
        if code != 0:
            print(
                f"ec-connector demo: {script} failed with exit code {code}; its logs are in {logs}",
                file=sys.stderr,
            )
            return 1
    print(f"\nDone. Engine logs: {logs}/")
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
