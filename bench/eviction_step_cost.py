"""Step cost of eviction policies, candidates included: `bench/compare_cache.py`'s engine-step
replay (lookups, reservations, pins and readiness of ~256 live requests a step) through our table
with each policy, the policies alternating over the repetitions; step p50 and p99 after the
region's first fill, and each p50 against the first policy's (`fifo` by default).

    .venv/bin/python bench/eviction_step_cost.py --policies fifo s3fifo lecar decayed-adaptive

Policies are named as in bench/eviction.py (shipped ones and its candidates, with `:k=v` settings).
`--split` adds, per policy, where a whole replay's time goes: inside the policy's methods (each
call timed through a wrapper, whose own cost is counted there) and in the table around them.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cache_traces import SOURCES, make_trace  # noqa: E402
from bench.eviction import _ours  # noqa: E402
from ec_connector.benchmarks.compare_cache import ROW_BYTES, GiB, replay  # noqa: E402


def step_costs(
    policies: list[str], *, trace_name: str, steps: int, reps: int, region_gib: float, seed: int
) -> dict[str, dict[str, float]]:
    """Per policy: step p50 and p99 in µs over `reps` alternating replays (the first tenth of the
    steps, while the region fills, left out), and the p50 against the first policy's."""
    num_blocks = int(region_gib * GiB) // ROW_BYTES
    trace = make_trace(steps=steps, live=256, num_blocks=num_blocks, seed=seed, source=trace_name)
    warm = steps // 10
    makers = {policy: _ours(policy) for policy in policies}
    samples: dict[str, list[float]] = {policy: [] for policy in policies}
    for _ in range(reps):
        for policy, make in makers.items():
            side = make(num_blocks)
            gc.collect()
            samples[policy].extend(replay(side, trace)[warm:])
    out: dict[str, dict[str, float]] = {}
    for policy, values in samples.items():
        ordered = sorted(values)
        out[policy] = {
            "p50_us": statistics.median(ordered) * 1e6,
            "p99_us": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6,
        }
    base = out[policies[0]]["p50_us"]
    for figures in out.values():
        figures["p50_ratio"] = figures["p50_us"] / base
    return out


class _TimedPolicy:
    """The table's policy with every method call timed: `spent` is the seconds inside them."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.spent = 0.0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.spent += time.perf_counter() - t0

        return timed


def policy_split(
    policies: list[str], *, trace_name: str, steps: int, reps: int, region_gib: float, seed: int
) -> dict[str, dict[str, float]]:
    """Per policy: a whole replay's ms, and of it the ms inside the policy's methods and in the
    table around them (the fastest of `reps` alternating replays for each)."""
    num_blocks = int(region_gib * GiB) // ROW_BYTES
    trace = make_trace(steps=steps, live=256, num_blocks=num_blocks, seed=seed, source=trace_name)
    makers = {policy: _ours(policy) for policy in policies}
    best: dict[str, dict[str, float]] = {}
    for _ in range(reps):
        for policy, make in makers.items():
            side = make(num_blocks)
            timed = _TimedPolicy(side.table._policy)
            side.table._policy = timed  # type: ignore[assignment]  # every call goes through the timer
            gc.collect()
            total = sum(replay(side, trace))
            figures = best.setdefault(policy, {"total_ms": math.inf, "policy_ms": math.inf})
            figures["total_ms"] = min(figures["total_ms"], total * 1e3)
            figures["policy_ms"] = min(figures["policy_ms"], timed.spent * 1e3)
    for figures in best.values():
        figures["table_ms"] = figures["total_ms"] - figures["policy_ms"]
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--policies", nargs="+", default=["fifo", "s3fifo", "lecar"], help="the first is the base"
    )
    ap.add_argument("--trace", choices=SOURCES, default="compare")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--region-gib", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--split", action="store_true", help="also time the policy apart from the table")
    args = ap.parse_args(argv)

    def measured(how: Callable[..., dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
        return how(
            args.policies,
            trace_name=args.trace,
            steps=args.steps,
            reps=args.reps,
            region_gib=args.region_gib,
            seed=args.seed,
        )

    res = measured(step_costs)
    for policy, figures in res.items():
        print(
            f"{policy:>24}  step p50 {figures['p50_us']:7.0f} µs  p99 {figures['p99_us']:7.0f} µs  "
            f"p50 / {args.policies[0]} {figures['p50_ratio']:.2f}x"
        )
    if args.split:
        split = measured(policy_split)
        print(f"a whole replay ({args.steps} steps), fastest of {args.reps}:")
        for policy, figures in split.items():
            print(
                f"{policy:>24}  {figures['total_ms']:7.1f} ms: in the policy {figures['policy_ms']:6.1f} ms, "
                f"in the table {figures['table_ms']:6.1f} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
