"""The serving bench's time: what a run and each engine child are expected to take, and whether a
child still fits in what `--budget-s` leaves.

A child's need starts from `estimate_s` (engine starts, imports, the requests at --est-req-s) and
is then calibrated on the engines this run has already finished: the same arm's earlier rounds
serve the same requests, so their wall time is its need; an arm not yet run gets its estimate
times the largest measured / estimated ratio of the engines that ended ok (the estimate's error
on this machine so far). A child whose timeout the budget would clamp below its need is not
started (it would only be killed): it is marked "not run (budget)" as one past the budget.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from ec_connector.benchmarks.serving_engine import ARMS
from ec_connector.benchmarks.serving_fleet import FLEET_ARMS, PASS_SETTLE_S, SETTLE_S

# Seconds an engine child gets beyond twice its need before it is killed.
TIMEOUT_SLACK_S = 120.0


def run_mode(wls: list[dict[str, Any]]) -> str:
    """ "epd", "fleet" or "" (single engines); raises SystemExit when a run mixes them."""
    modes = {"epd" if w["name"] == "epd" else "fleet" if w["name"].startswith("fleet-") else "" for w in wls}
    if len(modes) > 1:
        raise SystemExit(
            "--workloads epd and fleet each run alone (their engines differ): give them a run of their own"
        )
    return modes.pop()


def mode_arms(mode: str) -> tuple[str, ...]:
    return FLEET_ARMS if mode == "fleet" else ARMS


def arm_workloads(arm: str, wls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The limit (encoder stubbed) is the no-connector engine's floor: only `none` serves it."""
    return [w for w in wls if arm == "none" or not w["stub_encoder"]]


def estimate_s(args: argparse.Namespace, arms: list[str], wls: list[dict[str, Any]]) -> float:
    """Seconds for `args.rounds` rounds of `arms`: per child its engine starts (two for the fleet
    arms but `single`), 15 s of imports and shutdown, every request (unmeasured fills included)
    at --est-req-s and, for the fleet, its settle pauses."""
    start = args.est_start_s if args.est_start_s else (12.0 if args.mode == "eager" else 60.0)
    fleet = run_mode(wls) == "fleet"
    total = 0.0
    for arm in arms:
        mine = arm_workloads(arm, wls)
        reqs = sum(sum(len(p["seeds"]) for p in w["passes"]) for w in mine)
        engines = 2 if fleet and arm != "single" else 1
        settle = SETTLE_S + PASS_SETTLE_S * sum(len(w["passes"]) for w in mine) if fleet else 0.0
        total += start * engines + 15.0 + settle + reqs / args.est_req_s
    return total * args.rounds


def engine_need_s(arm: str, estimate: float, finished: Sequence[dict[str, Any]]) -> float:
    """Seconds a child of `arm` estimated at `estimate` s is expected to take, from the engine
    records of this run so far (each with "arm", "status", "seconds" and "estimate_s" where it
    ran): the longest ok run of the same arm; else `estimate` times the largest seconds /
    estimate_s of the records that ended ok (never below 1: an estimate that ran long elsewhere
    is not trusted to run short here), and at least the longest killed run of the same arm (it
    needed more than that)."""
    ran = [e for e in finished if "seconds" in e and e.get("estimate_s")]
    same_ok = [e["seconds"] for e in ran if e["arm"] == arm and e["status"] == "ok"]
    if same_ok:
        return float(max(same_ok))
    ratios = [e["seconds"] / e["estimate_s"] for e in ran if e["status"] == "ok"]
    killed = [e["seconds"] for e in ran if e["arm"] == arm and "killed" in e["status"]]
    return max([estimate * max([1.0, *ratios]), *killed])


def child_timeout(need: float, configured: float, left: float) -> float | None:
    """The child's timeout: `configured` (0: twice `need` + TIMEOUT_SLACK_S), clamped to the
    `left` seconds of the budget; None (do not start it) when the clamp puts it below `need`."""
    wanted = configured or need * 2 + TIMEOUT_SLACK_S
    if left < wanted and left < need:
        return None
    return min(wanted, left)
