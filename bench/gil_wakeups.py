"""What a background thread that wakes on a timer costs a busy Python thread (the engine's step
thread, bound by its host work at small images), side by side in one run.

    .venv/bin/python bench/gil_wakeups.py [--seconds 1.0] [--reps 5]

Each case runs a pure-Python loop on the main thread for `--seconds` with one background thread:
`none` (no thread), `queue` (blocked in an empty queue: the log writer now), `timer-20ms` (wakes
every 20 ms and finds nothing to do: the log writer before), `timer-2ms` (every 2 ms) and
`after-step` (woken by each 40 ms "step" and polling 2 ms later: the worker's completion watcher
while saves are in flight). Cases alternate over `--reps` repetitions, each in a fresh process;
printed: the loop's iterations a second against `none` (median and range) and the main thread's
voluntary context switches a second (it blocked: here, on the GIL).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

CASES = ("none", "queue", "timer-20ms", "timer-2ms", "after-step")
STEP_S = 0.040


def _switches() -> int:
    for line in Path("/proc/thread-self/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    return 0


def _background(case: str, stop: threading.Event, step: threading.Event) -> threading.Thread | None:
    def timer(period: float) -> None:
        while not stop.wait(period):
            pass

    def blocked() -> None:
        q: queue.SimpleQueue[None] = queue.SimpleQueue()
        while not stop.is_set():
            with contextlib.suppress(queue.Empty):
                q.get(timeout=0.5)

    def after_step() -> None:
        while not stop.is_set():
            if step.wait(0.5):
                step.clear()
                time.sleep(0.002)

    target = {
        "queue": blocked,
        "timer-20ms": lambda: timer(0.020),
        "timer-2ms": lambda: timer(0.002),
        "after-step": after_step,
    }.get(case)
    if target is None:
        return None
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def one(case: str, seconds: float, release: bool) -> dict[str, float]:
    """Run `case` in this process: the loop's iterations a second and its blocks a second."""
    stop, step = threading.Event(), threading.Event()
    thread = _background(case, stop, step)
    time.sleep(0.05)
    before = _switches()
    t0 = time.perf_counter()
    next_step = t0 + STEP_S
    n, acc = 0, 0
    while True:
        for i in range(200):  # Python work between clock reads
            acc += i * i % 7
        if release:
            time.sleep(0)  # gives the GIL up and takes it back, as a call into torch or CUDA does
        n += 1
        now = time.perf_counter()
        if now >= next_step:
            step.set()
            next_step += STEP_S
        if now - t0 >= seconds:
            break
    elapsed = time.perf_counter() - t0
    blocks = _switches() - before
    stop.set()
    if thread is not None:
        thread.join()
    return {"loops_s": n / elapsed, "blocks_s": blocks / elapsed}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--release", action="store_true", help="the loop gives the GIL up each iteration")
    ap.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # a child's one case
    args = ap.parse_args()
    if args.case:
        print(json.dumps(one(args.case, args.seconds, args.release)))
        return 0
    got: dict[str, list[dict[str, float]]] = {c: [] for c in CASES}
    for rep in range(args.reps):
        order = CASES[rep % len(CASES) :] + CASES[: rep % len(CASES)]
        for case in order:
            out = subprocess.run(
                [sys.executable, __file__, "--case", case, "--seconds", str(args.seconds)]
                + (["--release"] if args.release else []),
                capture_output=True,
                text=True,
                check=True,
            )
            got[case].append(json.loads(out.stdout))
    base = [r["loops_s"] for r in got["none"]]
    print(f"{'case':<12} {'loops/s vs none':>24} {'main thread blocks/s':>22}")
    for case in CASES:
        ratios = [r["loops_s"] / b for r, b in zip(got[case], base, strict=True)]
        blocks = statistics.median(r["blocks_s"] for r in got[case])
        spread = f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
        print(f"{case:<12} {spread:>24} {blocks:>22.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
