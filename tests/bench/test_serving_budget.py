"""The serving bench's budget rule (serving_budget.py): a child's need calibrated on the engines
already finished, and no child started with a timeout the budget clamps below that need."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ec_connector.benchmarks import serving
from ec_connector.benchmarks.serving_budget import TIMEOUT_SLACK_S, child_timeout, engine_need_s

ITEM = 768 * 3584 * 2


def _rec(arm: str, seconds: float, estimate: float, status: str = "ok") -> dict[str, Any]:
    return {"arm": arm, "round": 0, "status": status, "seconds": seconds, "estimate_s": estimate}


def test_a_clamped_timeout_below_the_need_is_not_started() -> None:
    # the H200 fleet run: 54 s of --budget-s left for an arm that needs ~70 s
    assert child_timeout(70.0, 0.0, 54.0) is None
    assert child_timeout(50.0, 0.0, 54.0) == 54.0  # clamped, but the need still fits
    assert child_timeout(70.0, 0.0, float("inf")) == 2 * 70 + TIMEOUT_SLACK_S
    assert child_timeout(70.0, 400.0, 100.0) == 100.0
    assert child_timeout(70.0, 30.0, float("inf")) == 30.0  # a --child-timeout-s given is the user's


def test_the_need_comes_from_the_same_arms_earlier_round_else_the_estimates_error_so_far() -> None:
    # round 0 of the H200 fleet run: pairs estimated at 54.7 s took 86-90 s
    done = [_rec("upstream", 89.0, 54.7), _rec("local", 86.0, 54.7), _rec("fleet", 90.0, 54.7)]
    assert engine_need_s("single", 42.7, done) == pytest.approx(42.7 * 90.0 / 54.7)  # ~70 s, not 42.7
    assert engine_need_s("local", 54.7, [*done, _rec("local", 81.0, 54.7)]) == 86.0  # its longest ok run
    # an estimate that ran short elsewhere is not trusted to run short here
    assert engine_need_s("single", 40.0, [_rec("local", 30.0, 60.0)]) == 40.0
    # a killed run of the arm needed more than it got; a skipped or budget record calibrates nothing
    killed = _rec("single", 54.0, 42.7, "failed (killed after 54 s)")
    assert engine_need_s("single", 42.7, [killed]) == 54.0
    assert (
        engine_need_s("ours", 30.0, [{"arm": "upstream", "round": 0, "status": "not run (budget)"}]) == 30.0
    )
    assert engine_need_s("ours", 30.0, []) == 30.0


def _rounds(tmp_path: Path, budget: float, monkeypatch: pytest.MonkeyPatch, took: float) -> list[dict]:
    args = serving.parser().parse_args(
        ["run", "--out", str(tmp_path), "--workloads", "pressure", "--arms", "upstream,ours", "--rounds", "2",
         "--budget-s", str(budget), "--requests-per-pass", "8", "--pressure-fill", "8", "--passes", "1"]
    )  # fmt: skip
    geometry = {"hidden": 3584, "min_pixels": 3136, "max_pixels": 12845056}
    wls = serving.workloads(args, geometry)
    started: list[float] = []

    def child(spec: dict, work: Path, log: Path, timeout_s: float) -> dict[str, Any]:
        started.append(timeout_s)
        return {"status": "ok", "seconds": took, "log": str(log)}

    monkeypatch.setattr(serving, "run_child", child)
    result: dict[str, Any] = {"run_id": "t", "engines": []}
    path = tmp_path / "run.json"
    serving.run_rounds(args, result, path, tmp_path, wls, ["upstream", "ours"], tmp_path, 1, "")
    assert json.loads(path.read_text())["engines"] == result["engines"]
    assert len(started) == sum(e["status"] == "ok" for e in result["engines"])
    return result["engines"]


def test_run_rounds_marks_what_the_budget_cannot_hold_and_calibrates_what_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engines = _rounds(tmp_path, 1.0, monkeypatch, took=0.0)
    assert [e["status"] for e in engines] == ["not run (budget)"] * 4
    assert all(e["need_s"] > 1.0 for e in engines)
    # every child ran 100 s where ~28 s were estimated: round 1 needs what round 0 took
    engines = _rounds(tmp_path, 10_000.0, monkeypatch, took=100.0)
    assert [e["status"] for e in engines] == ["ok"] * 4
    first, second = engines[0], engines[1]
    assert first["need_s"] == first["estimate_s"] < 100.0
    assert second["need_s"] == pytest.approx(second["estimate_s"] * 100.0 / first["estimate_s"], abs=0.1)
    assert [e["need_s"] for e in engines[2:]] == [100.0, 100.0]
