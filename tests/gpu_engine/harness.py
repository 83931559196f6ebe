"""Starting, bounding and observing the suite's engine processes (test side; stdlib only).

Every engine is a subprocess of the suite's interpreter (`sys.executable`) in a session of its
own, with a time limit: on expiry the whole process group is killed (a compiled engine has
compile workers of its own) and the test fails with the tail of the engine's log.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ENGINE_DIR = Path(__file__).parent / "engine"
REPO_ROOT = Path(__file__).resolve().parents[2]
SHM = Path("/dev/shm")
LOG_TAIL = 20000
PIDS_FILE = "EC_GPU_SUITE_PIDS"


def engine_env(device: str, runner: str, *, single_process: bool = True, **extra: str) -> dict[str, str]:
    """This process's environment for an engine: the drivers' folder and the repository first on
    PYTHONPATH (the GPU machine's vLLM kit and wheels stay after them), offline, the model runner.

    runner "v2" leaves vLLM's default (V2 on vLLM 0.33 with CUDA); "v1" sets VLLM_USE_V2_MODEL_RUNNER=0.
    """
    env = dict(os.environ)
    paths = [str(ENGINE_DIR), str(REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # flashinfer is not on the GPU machine
    if single_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if device == "cpu":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if runner == "v1":
        env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    else:
        env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    env.update(extra)
    return env


def tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-LOG_TAIL:]
    except OSError:
        return f"(no log at {log})"


def start(cmd: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen:
    """`cmd` in a new session (its own process group), stdout and stderr to `log`.

    With EC_GPU_SUITE_PIDS set, the process id is appended to that file: a run killed from outside
    (tools/gpu_suite.sh's time limit) kills these groups too, which left pytest's.
    """
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, env=dict(env), cwd=log.parent, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    pids = os.environ.get(PIDS_FILE)
    if pids:
        with open(pids, "a") as f:
            f.write(f"{proc.pid}\n")
    return proc


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to `proc`'s whole process group (it leads its own session); reap `proc` on SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    if sig == signal.SIGKILL:
        proc.wait()


def stop(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """SIGINT (a clean shutdown), then SIGKILL to the group after `grace_s`."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    kill_group(proc)  # also anything the process left behind in its group


def wait_exit(proc: subprocess.Popen, log: Path, limit_s: float, what: str) -> None:
    """Wait for `proc` to exit 0 within `limit_s`; otherwise kill its group and fail the test."""
    try:
        rc = proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        pytest.fail(f"{what} still running after {limit_s:.0f} s (killed):\n{tail(log)}")
    kill_group(proc)
    if rc != 0:
        pytest.fail(f"{what} exited with {rc}:\n{tail(log)}")


def run_driver(script: str, args: list[str], env: Mapping[str, str], log: Path, limit_s: float) -> None:
    """Run engine driver `script` (in ENGINE_DIR) with the suite's interpreter to completion."""
    import sys

    proc = start([sys.executable, str(ENGINE_DIR / script), *args], env, log)
    wait_exit(proc, log, limit_s, f"{script} {' '.join(args[:1])}")


def wait_until(
    check, limit_s: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None
):  # noqa: ANN001, ANN201
    """Poll `check()` until it returns a true value; fail if `proc` exits first or `limit_s` passes."""
    deadline = time.monotonic() + limit_s
    while True:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(
                f"{what}: the engine exited with {proc.returncode} first:\n{tail(log) if log else ''}"
            )
        if time.monotonic() > deadline:
            if proc is not None:
                kill_group(proc)
            pytest.fail(f"{what}: not within {limit_s:.0f} s\n{tail(log) if log else ''}")
        time.sleep(0.2)


def region_files(engine_id: str) -> list[Path]:
    """The connector's region files of `engine_id` in /dev/shm (one per data-parallel rank)."""
    return sorted(SHM.glob(f"vllm_ec_{engine_id}_dp*.mmap"))


def post_json(url: str, body: dict, timeout_s: float = 120) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.status, json.load(resp)


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """A Prometheus text page parsed into {(sample name, labels): value}."""
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    samples: dict[tuple[str, frozenset], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([^{\s]+)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$", line)
        assert m, f"unparsable /metrics line: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        samples[(m.group(1), labels)] = float(m.group(3))
    return samples


@contextlib.contextmanager
def serving(
    cmd: list[str], env: Mapping[str, str], log: Path, port: int, limit_s: float
) -> Iterator[subprocess.Popen]:
    """Run an OpenAI server until GET /health answers; stopped (SIGINT, then SIGKILL) on leaving."""
    proc = start(cmd, env, log)
    try:

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    return True
            except OSError:
                return False

        wait_until(healthy, limit_s, "OpenAI server health", proc, log)
        yield proc
    finally:
        stop(proc)
