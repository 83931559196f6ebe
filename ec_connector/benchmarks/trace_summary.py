"""Where a profiled pass's time went, from the torch profiler's Chrome trace that vLLM writes
(`profiler_config.torch_profiler_dir`): a few numbers a run's JSON can carry instead of the trace.

- the step thread: the thread whose top-level events cover the most time (vLLM's EngineCore step
  thread, or its worker's), its span (first event to last), and how much of the span its
  top-level events cover (the rest: it waited, or ran code the profiler does not record);
- the gaps between its top-level events over 0.1 ms (count, total, the largest with the events on
  either side and the ms into the span where each starts): where it waited, or ran Python the
  profiler does not record without stacks;
- its operators by self time (time in an event less its children's), the top `top`;
- CUDA runtime and driver calls on it by total time (a `cudaStreamSynchronize`, a blocking
  `cudaMemcpyAsync` or `cudaEventSynchronize` there is the step thread waiting for the GPU);
- the connector's hook ranges (`ec_tier.<hook>`, with VLLM_EC_PROFILE_RANGES set) on any thread:
  calls and total time each;
- the GPU: kernels' and memory copies' total time and the share of the span they cover (summed:
  overlapping streams can exceed 1).

Standard library only: the trace is JSON (gzipped or not) with `traceEvents` of phase "X".
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

HOST_CATEGORIES = frozenset({"cpu_op", "python_function", "user_annotation", "cuda_runtime", "cuda_driver"})
CUDA_CALLS = frozenset({"cuda_runtime", "cuda_driver"})
TOP = 25
GAP_MIN_US = 100.0  # a step thread's gap between top-level events counted from this long
GAPS_SHOWN = 5
RANGE_PREFIX = "ec_tier."  # adapters/profile_ranges.py names the connector's hooks so


def load(path: Path) -> list[dict[str, Any]]:
    """The complete ("X") events of one trace file."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e and "ts" in e]


def _self_times(events: list[dict[str, Any]]) -> tuple[dict[str, float], list[tuple[float, float, str]]]:
    """Self time by name of one thread's events (µs), and its top-level events as (start, end,
    name) in order."""
    ordered = sorted(events, key=lambda e: (float(e["ts"]), -float(e["dur"])))
    self_us: dict[str, float] = defaultdict(float)
    stack: list[tuple[float, dict[str, Any]]] = []  # (end, event)
    tops: list[tuple[float, float, str]] = []
    for e in ordered:
        ts, dur = float(e["ts"]), float(e["dur"])
        while stack and stack[-1][0] <= ts:
            stack.pop()
        if stack:
            self_us[stack[-1][1]["name"]] -= min(dur, stack[-1][0] - ts)  # a child's time is not its parent's
        else:
            tops.append((ts, ts + dur, str(e["name"])))
        self_us[e["name"]] += dur
        stack.append((ts + dur, e))
    return dict(self_us), tops


def _gaps(tops: list[tuple[float, float, str]], largest: int = GAPS_SHOWN) -> dict[str, Any]:
    """The step thread's time between top-level events: waits, and Python the profiler does not
    record without stacks (the scheduler's, between vLLM's step ranges). Gaps over GAP_MIN_US are
    counted and summed; the largest are named by the events on either side, with where they start
    in the span (ms from its first event): a wait at the start is the pass's first request still
    on its way, one in the middle a stall."""
    start = tops[0][0] if tops else 0.0
    pairs = zip(tops, tops[1:], strict=False)
    found = [(b[0] - a[1], a[2], b[2], a[1] - start) for a, b in pairs if b[0] - a[1] > GAP_MIN_US]
    found.sort(key=lambda g: -g[0])
    return {
        "over_min": len(found),
        "over_min_ms": round(sum(g[0] for g in found) * 1e-3, 3),
        "largest": [
            [round(us * 1e-3, 3), before, after, round(at * 1e-3, 3)]
            for us, before, after, at in found[:largest]
        ],
    }


def _thread_key(e: dict[str, Any]) -> tuple[str, str]:
    return (str(e.get("pid")), str(e.get("tid")))


def summarize(events: Iterable[dict[str, Any]], top: int = TOP) -> dict[str, Any]:
    """The summary described in the module docstring; empty figures for a trace without host events."""
    host: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    kernel_us = copy_us = 0.0
    kernels = 0
    for e in events:
        cat = e.get("cat", "")
        if cat in HOST_CATEGORIES:
            host[_thread_key(e)].append(e)
        elif cat == "kernel":
            kernel_us += float(e["dur"])
            kernels += 1
        elif cat in ("gpu_memcpy", "gpu_memset"):
            copy_us += float(e["dur"])
    if not host:
        return {
            "step_thread": None,
            "span_ms": 0.0,
            "ops": [],
            "cuda_calls": [],
            "hook_ranges": {},
            "gaps": {},
            "gpu": {},
        }
    covers = {key: _self_times(evs) for key, evs in host.items()}
    step = max(covers, key=lambda key: sum(end - start for start, end, _ in covers[key][1]))
    self_us, tops = covers[step]
    covered = sum(end - start for start, end, _ in tops)
    evs = host[step]
    begin = min(float(e["ts"]) for e in evs)
    span = max(float(e["ts"]) + float(e["dur"]) for e in evs) - begin
    ranges: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in (e for thread in host.values() for e in thread):
        if str(e["name"]).startswith(RANGE_PREFIX):
            ranges[e["name"]][0] += 1
            ranges[e["name"]][1] += float(e["dur"])
    calls: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in evs:
        if e.get("cat") in CUDA_CALLS:
            calls[e["name"]][0] += 1
            calls[e["name"]][1] += float(e["dur"])
    ops = sorted(self_us.items(), key=lambda kv: -kv[1])[:top]
    ms = 1e-3
    return {
        "step_thread": {"pid": step[0], "tid": step[1], "events": len(evs)},
        "span_ms": round(span * ms, 3),
        "covered_share": round(covered / span, 4) if span else 0.0,
        "gaps": _gaps(tops),
        "ops": [[name, round(us * ms, 3)] for name, us in ops],
        "cuda_calls": [
            [name, int(n), round(us * ms, 3)]
            for name, (n, us) in sorted(calls.items(), key=lambda kv: -kv[1][1])
        ][:top],
        "hook_ranges": {name: [int(n), round(us * ms, 3)] for name, (n, us) in sorted(ranges.items())},
        "gpu": {
            "kernels": kernels,
            "kernel_ms": round(kernel_us * ms, 3),
            "copy_ms": round(copy_us * ms, 3),
            "kernel_share": round(kernel_us / span, 4) if span else 0.0,
        },
    }


def summarize_dir(folder: Path, since: float = 0.0, top: int = TOP) -> list[dict[str, Any]]:
    """One summary per trace file in `folder` written at or after `since` (a time.time()), with its
    file name: the worker's trace and the front end's each get theirs."""
    out = []
    for path in sorted(folder.glob("*.json*")) if folder.is_dir() else ():
        if path.stat().st_mtime >= since:
            out.append({"file": path.name, **summarize(load(path), top)})
    return out
