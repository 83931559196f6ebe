"""The serving bench's engine children: start one, echo its progress, stop it at its timeout, reap
its process group, collect its JSON lines and the region files its engines left.

Each child is `python -m ec_connector.benchmarks.<serving_engine|serving_epd|serving_fleet> SPEC`
in a session of its own, with the hook folder (serving_hook.py as sitecustomize) first on its path.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ec_connector.benchmarks import serving_hook
from ec_connector.benchmarks.serving_hook import HOOK_DIR_ENV

PACKAGE_PARENT = Path(__file__).resolve().parents[2]
PROFILE_RANGES_ENV = "VLLM_EC_PROFILE_RANGES"  # read by adapters/profile_ranges.py in the engine


def child_env(hook_dir: Path) -> dict[str, str]:
    """The engine child's environment: the hook folder first on PYTHONPATH (its sitecustomize runs
    in every process of the engine), then this package's folder unless the interpreter finds it
    anyway (a source checkout or PYTHONPATH; site-packages must keep its place after the stdlib)."""
    env = dict(os.environ)
    path = [str(hook_dir)]
    if str(PACKAGE_PARENT) not in {str(Path(p).resolve()) for p in site.getsitepackages()}:
        path.append(str(PACKAGE_PARENT))
    path += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env[HOOK_DIR_ENV] = str(hook_dir)
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Stopped(Exception):
    """The parent got SIGTERM (e.g. from `timeout`): stop, keep what is done."""


def on_sigterm(signum: int, frame: Any) -> None:
    raise Stopped(f"signal {signum}")


def _echo(tail: Any) -> None:
    for line in tail.readlines():
        if line.startswith("[bench]"):
            print(f"  {line.rstrip()}", flush=True)


def _wait(proc: subprocess.Popen, log: Path, started: float, timeout_s: float) -> str:
    """Echo the child's progress lines until it exits or its timeout; returns its status."""
    with log.open() as tail:
        while True:
            _echo(tail)
            code = proc.poll()
            if code is not None:
                _echo(tail)
                return {0: "ok", 3: "skipped"}.get(code, f"failed (exit {code})")
            if time.monotonic() - started > timeout_s:
                return f"failed (killed after {timeout_s:.0f} s)"
            time.sleep(0.5)


def _reap_group(proc: subprocess.Popen, grace_s: float) -> None:
    """Wait for every process of the child's group (EngineCore, workers) to go, so the next arm
    starts on a free GPU: `grace_s`, then SIGTERM, then SIGKILL what stays."""
    pgid = proc.pid
    for sig, wait_s in ((None, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        if sig is not None and _group_alive(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
        deadline = time.monotonic() + wait_s
        while True:
            proc.poll()  # reap the leader: a zombie still counts as a member of its group
            if not _group_alive(pgid) or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if not _group_alive(pgid):
            return


def _in_use(path: Path) -> bool:
    """Whether any process has `path` open or mapped (Linux /proc; unreadable entries are skipped)."""
    target = str(path)
    for proc_dir in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            for fd in (proc_dir / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) == target:
                        return True
            if target in (proc_dir / "maps").read_text():
                return True
    return False


def _engine_ids(spec: Any) -> set[str]:
    """Every `engine_id` named in `spec` (the connectors of its engines, at any depth)."""
    if isinstance(spec, dict):
        found = {v for k, v in spec.items() if k == "engine_id" and isinstance(v, str)}
        return found.union(*(_engine_ids(v) for v in spec.values()))
    if isinstance(spec, list):
        return set().union(*(_engine_ids(v) for v in spec))
    return set()


def _region_files(engine_ids: set[str]) -> set[Path]:
    """The /dev/shm region files of these engines (both connectors name them vllm_ec_<engine id>...)."""
    return {f for eid in engine_ids for f in Path("/dev/shm").glob(f"vllm_ec_{eid}*")}


def run_child(spec: dict[str, Any], work: Path, log: Path, timeout_s: float) -> dict[str, Any]:
    """Run one engine child to its end or its timeout; returns its status and JSON lines."""
    hook_dir = Path(tempfile.mkdtemp(prefix="hook_", dir=work))
    shutil.copyfile(Path(serving_hook.__file__), hook_dir / "sitecustomize.py")
    spec_path = work / f"{spec['tag']}.spec.json"
    spec_path.write_text(json.dumps(spec))
    child = (
        "serving_epd"
        if "producer_engine" in spec
        else "serving_fleet"
        if "replicas" in spec
        else "serving_engine"
    )
    cmd = [sys.executable, "-m", f"{__package__}.{child}", str(spec_path)]
    engine_ids = _engine_ids(spec)
    started = time.monotonic()
    env = child_env(hook_dir)
    if spec.get("profile_pass"):
        env.setdefault(PROFILE_RANGES_ENV, "1")  # the connector's hooks named in the trace
    with log.open("w") as logf:
        proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    status = ""
    try:
        status = _wait(proc, log, started, timeout_s)
    finally:
        # also when the parent is stopped (SIGTERM, Ctrl-C) mid-child: then no grace
        _reap_group(proc, 20.0 if status and "killed" not in status else 0.0)
    lines = []
    results = Path(spec["results"])
    if results.exists():
        lines = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    record: dict[str, Any] = {"status": status, "seconds": time.monotonic() - started, "log": str(log)}
    for line in lines:
        kind = line.pop("kind")
        if kind == "engine":
            record["engine"] = line
        elif kind == "workload":
            record.setdefault("workloads", []).append(line)
        elif kind == "skipped":
            record["reason"] = line["reason"]
    # Region files this child's engines left (a killed engine cannot unlink its own): recorded, then
    # removed so the next arms do not run short of /dev/shm; only its own engines' files, and only
    # those no process holds, since other engines on the host (or other tests) have regions there too.
    left = [f for f in sorted(_region_files(engine_ids)) if not _in_use(f)]
    if left:
        record["leftover_shm"] = [str(f) for f in left]
        for f in left:
            f.unlink(missing_ok=True)
    if status.startswith("failed"):
        record["log_tail"] = log.read_text(errors="replace").splitlines()[-25:]
    shutil.rmtree(hook_dir, ignore_errors=True)
    return record
