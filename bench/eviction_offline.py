"""Offline references for bench/eviction.py: how far any eviction policy could go on a trace.

Two figures per trace and region, both knowing the whole trace in advance:

- `belady`: an offline policy run in our EntryTable like the others (same run floor and cap, pins,
  saves in flight): it evicts the evictable entry whose next request is farthest in the future
  (Belady's MIN; sizes in blocks). It is achievable, so its miss ratio shows what an online policy
  could approach. With sizes that differ it is not exactly optimal (the optimum of variable-size
  caching is NP-hard), which is why the bound below exists.
- `bound`: a lower bound on the miss ratio of every policy, offline ones included (the
  space-time relaxation of Berger et al., "Practical Bounds on Optimal Caching with Variable
  Object Sizes", SIGMETRICS '18). A request is a hit only if its item stayed in the region since
  its previous request, which occupies `rows x steps between them` of the region's
  `blocks x steps`; the most hits any policy can make is at most what a fractional knapsack of
  those intervals, cheapest per hit first, fits into that budget. If `bound` is above 0.85x
  `fifo`'s miss ratio, the issue's target is infeasible there for every policy.

Counting follows bench/eviction.py's driver: requests for one item within one step form a group;
a group is a hit (each of its requests counts as one) or a miss (its first request is a miss, the
others wait for the save and are not counted). The bound takes the most hit groups and the most
hit requests separately (each a knapsack), which can only lower it; it ignores failed saves and
the run floor, which can only lower it too.
"""

from __future__ import annotations

from bench.cache_traces import Trace
from ec_connector.benchmarks.replay import BeladyPolicy, RequestClock, request_positions

# The offline policy and the driver's clock live with the replay they serve (the serving bench uses
# them too); they are re-exported here for the eviction bench and its tests.
__all__ = ["BeladyPolicy", "RequestClock", "miss_ratio_bound", "request_positions"]


def miss_ratio_bound(trace: Trace, num_blocks: int) -> dict[str, float]:
    """The space-time lower bound on the miss ratio of any policy for `trace` in a region of
    `num_blocks` blocks (module docstring), with the figures it comes from."""
    last: dict[str, int] = {}  # item -> step of its previous group
    groups = 0
    intervals: list[tuple[int, int]] = []  # (blocks x steps the hit costs, requests it serves)
    for n, step in enumerate(trace.steps):
        sizes: dict[str, int] = {}
        counts: dict[str, int] = {}
        for _, items in step.arrivals:
            for item in items:
                sizes[item.key] = item.rows
                counts[item.key] = counts.get(item.key, 0) + 1
        groups += len(counts)
        for key, count in counts.items():
            prev = last.get(key)
            if prev is not None:
                intervals.append((sizes[key] * (n - prev), count))
            last[key] = n
    budget = num_blocks * len(trace.steps)
    max_hit_groups = _knapsack(sorted(c for c, _ in intervals), budget)
    max_hit_requests = _knapsack_weighted(intervals, budget)
    misses = groups - max_hit_groups
    return {
        "miss_ratio": misses / max(1e-9, misses + max_hit_requests),
        "compulsory_groups": groups - len(intervals),
        "groups": groups,
        "max_hit_groups": max_hit_groups,
        "max_hit_requests": max_hit_requests,
    }


def _knapsack(costs: list[int], budget: int) -> float:
    """Most unit-value items of ascending `costs` that fit `budget`, the last one fractionally."""
    total = 0.0
    for cost in costs:
        if cost > budget:
            return total + budget / cost
        budget -= cost
        total += 1
    return total


def _knapsack_weighted(items: list[tuple[int, int]], budget: int) -> float:
    """Most value of (cost, value) items that fits `budget`, best value per cost first, the last
    one fractionally: the fractional knapsack's optimum."""
    total = 0.0
    for cost, value in sorted(items, key=lambda cv: cv[0] / cv[1]):
        if cost > budget:
            return total + value * budget / cost
        budget -= cost
        total += value
    return total
