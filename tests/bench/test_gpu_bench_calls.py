"""tools/gpu_bench.sh, the serving bench's H200 calls by name: every call's arguments are accepted by
the bench and plan within their budget (`--dry-run` under the vLLM venv, which writes the 7B-sized
model's config and prints the estimate), and extra arguments reach the bench after the call's own."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.bench.serving_run import REPO, SCRIPT, bench_env
from tests.integration.conftest import vllm_python  # noqa: F401  (fixture)

TOOL = REPO / "tools" / "gpu_bench.sh"
# every call of the script's `case` (so that a new one cannot go untested)
CALLS = tuple(
    name
    for line in TOOL.read_text().splitlines()
    if (m := re.match(r"\s+([a-z0-9|-]+)\) ARGS=", line))
    for name in m.group(1).split("|")
)


def printed(*args: str) -> list[str]:
    proc = subprocess.run(["bash", str(TOOL), "--print", *args], capture_output=True, text=True, check=True)
    return shlex.split(proc.stdout)


def test_the_budget_and_extra_arguments_reach_the_bench_after_the_calls_own() -> None:
    args = printed("fleet", "300", "--first-round", "3")
    assert args[args.index("--budget-s") + 1] == "300"
    assert args[-2:] == ["--first-round", "3"] and args[args.index("--out") + 1] == "/tmp/bench-fleet"
    assert printed("epd")[printed("epd").index("--budget-s") + 1] == "470"


def test_the_calls_are_read_from_the_scripts_case() -> None:
    assert {"eager", "fleet-pressure", "fleet-2b", "fleet-2b-large", "small-profile"} <= set(CALLS)
    assert len(CALLS) == len(set(CALLS)) >= 13


def test_an_unknown_call_is_refused_naming_it() -> None:
    proc = subprocess.run(["bash", str(TOOL), "--print", "warp"], capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown call warp" in proc.stderr


@pytest.mark.parametrize("call", CALLS)
def test_each_call_plans_within_its_budget(call: str, vllm_python: Path, tmp_path: Path) -> None:  # noqa: F811
    args = printed(call, "530", "--out", str(tmp_path))
    proc = subprocess.run(
        [str(vllm_python), str(SCRIPT), "run", *args, "--dry-run"],
        env=bench_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    minutes = float(re.search(r"estimate ([0-9.]+) min", proc.stdout).group(1))
    assert 0 < minutes * 60 <= 530, proc.stdout[-1500:]
