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

import heapq
from bisect import bisect_right
from collections.abc import Container, Mapping

from bench.cache_traces import Trace
from ec_connector.domain.entries import Entry

_NEVER = 1 << 62  # the next request of an item that is never requested again


class RequestClock:
    """The driver's position: the index of the request being served (requests in trace order)."""

    __slots__ = ("pos",)

    def __init__(self) -> None:
        self.pos = -1


def request_positions(trace: Trace) -> dict[str, list[int]]:
    """Each item's request indices, ascending, in the order bench/eviction.py's driver serves
    them (steps in order, requests of a step in arrival order)."""
    out: dict[str, list[int]] = {}
    for pos, item in enumerate(trace.items()):
        out.setdefault(item.key, []).append(pos)
    return out


class BeladyPolicy:
    """Offline: the evictable entry requested again farthest in the future goes first (never
    requested again: first of all). A max-heap by next request, lazily deleted; an entry's next
    request is computed when it becomes evictable, and it cannot change while it stays so (a
    request of it pins it first, which takes it out)."""

    name = "belady"

    def __init__(
        self, evictable: Mapping[str, Entry], positions: Mapping[str, list[int]], clock: RequestClock
    ) -> None:
        self._evictable = evictable
        self._positions = positions
        self._clock = clock
        self._heap: list[tuple[int, int, str]] = []  # (-next request, stamp, key)
        self._stamps: dict[str, int] = {}
        self._stamp = 0

    def next_request(self, key: str) -> int:
        uses = self._positions.get(key, ())
        i = bisect_right(uses, self._clock.pos)
        return uses[i] if i < len(uses) else _NEVER

    def reserved(self, entry: Entry) -> None:
        pass

    def read(self, entry: Entry) -> None:
        pass

    def freed(self, entry: Entry) -> None:
        self._stamps.pop(entry.key, None)

    def listed(self, entry: Entry) -> None:
        self._stamp += 1
        self._stamps[entry.key] = self._stamp
        heapq.heappush(self._heap, (-self.next_request(entry.key), self._stamp, entry.key))
        if len(self._heap) > max(64, 2 * len(self._evictable)):
            self._heap = [i for i in self._heap if self._stamps.get(i[2]) == i[1] and i[2] in self._evictable]
            heapq.heapify(self._heap)

    def victims(self, needed: int, protect: Container[str]) -> list[Entry]:
        out: list[Entry] = []
        skipped = []
        while needed > 0:
            item = heapq.heappop(self._heap)
            entry = self._evictable.get(item[2])
            if entry is None or self._stamps.get(item[2]) != item[1] or entry in out:
                continue  # stale
            if item[2] in protect:
                skipped.append(item)
                continue
            out.append(entry)
            needed -= entry.rows
        for item in skipped:
            heapq.heappush(self._heap, item)
        return out

    def queued(self) -> int:
        return len(self._heap)

    def rank(self, entry: Entry) -> tuple[int, int]:
        return (-self.next_request(entry.key), entry.order)


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
