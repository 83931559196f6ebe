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

And one that knows less:

- `popularity`: what a policy that knew each item's request rate, but not the order of requests,
  could do: the evictable entry of lowest rate per block in the current popularity regime goes
  first, in our table. Rates come from the trace generator's own Zipf rankings (`Trace.rankings`:
  one for a stationary trace, one per re-ranking for `drift` and `engine-drift`; an item in no
  ranking, a scan's one-off, has rate 0), not from the trace's counts, which would tell the
  future. Under independent requests of known rates this is the best online order (A0; Aho,
  Denning and Ullman, JACM 1971, for equal sizes); every online policy here (LFU, decayed counts,
  their adaptive forms) learns those rates from the requests it has seen. If `popularity` misses
  more than 0.85x `fifo`, no policy that learns rates meets the target there.

And one between those two and the online policies:

- `posterior`: an online order that knows the trace's law but not the ranking: each regime's Zipf
  exponent, its pool size and when it starts (a regime's ranking is a fresh shuffle of the pool,
  so every key is equally likely to hold any rank), and counts every request it has seen. The
  evictable entry whose posterior mean request probability per block is lowest goes first: the
  mean over the regime's rank probabilities `p_k`, weighted by `p_k^n (1 - p_k)^(N - n)` for a
  key requested `n` times in the regime's `N` requests so far. Requests are drawn independently
  and every request is seen whether or not it hits, so nothing is gained by exploring: this is the
  best an online policy can do on such a trace to within the approximations of A0 (the rank
  probabilities treated as independent between keys, the posterior's next request only). If
  `posterior` misses more than 0.85x `fifo`, an online policy meets the target there only by the
  luck of the trace's draws. It needs
  every requested key to be in its regime's ranking (not `scan`, whose one-offs are in none).
  Per block is the order that keeps the most requests; `posterior-bytes` orders by the posterior
  mean alone (per entry), which keeps the most blocks requested, so its byte miss ratio is the one
  to read (on traces whose items all have one size the two are the same order).

Counting follows bench/eviction.py's driver: requests for one item within one step form a group;
a group is a hit (each of its requests counts as one) or a miss (its first request is a miss, the
others wait for the save and are not counted). The bound takes the most hit groups and the most
hit requests separately (each a knapsack), which can only lower it; it ignores failed saves and
the run floor, which can only lower it too.
"""

from __future__ import annotations

import math
from collections.abc import Container, Mapping
from dataclasses import dataclass

import numpy as np

from bench.cache_traces import Trace
from ec_connector.benchmarks.replay import BeladyPolicy, LazyHeapOrder, RequestClock, request_positions
from ec_connector.domain.entries import Entry

# The offline policy and the driver's clock live with the replay they serve (the serving bench uses
# them too); they are re-exported here for the eviction bench and its tests.
__all__ = [
    "BeladyPolicy",
    "PopularityPolicy",
    "PosteriorPolicy",
    "RequestClock",
    "TraceLaw",
    "law_of",
    "miss_ratio_bound",
    "popularity_of",
    "regimes_of",
    "request_positions",
]

_RANK_SCALE = 1 << 40


def regimes_of(trace: Trace) -> list[int]:
    """Each request's popularity regime (its index in `trace.rankings`), by position, as the
    driver counts them."""
    starts = [first for first, _, _ in trace.rankings]
    regimes: list[int] = []
    regime = 0
    for n, step in enumerate(trace.steps):
        while regime + 1 < len(starts) and starts[regime + 1] <= n:
            regime += 1
        regimes.extend(regime for _, items in step.arrivals for _ in items)
    return regimes


def popularity_of(trace: Trace) -> tuple[list[int], list[dict[str, float]]]:
    """Each request's popularity regime (`regimes_of`) and each regime's weight per key
    (1/(rank+1)^exponent, from `trace.rankings`)."""
    weights = [
        {key: 1.0 / (rank + 1) ** alpha for rank, key in enumerate(keys)} for _, alpha, keys in trace.rankings
    ]
    return regimes_of(trace), weights


class PopularityPolicy(LazyHeapOrder):
    """Offline, knowing rates but not order: the evictable entry of lowest rate per block in the
    current regime goes first, oldest listed first among equals (module docstring); every key
    is taken anew when the regime changes."""

    name = "popularity"

    def __init__(
        self,
        evictable: Mapping[str, Entry],
        regimes: list[int],
        weights: list[dict[str, float]],
        clock: RequestClock,
    ) -> None:
        super().__init__(evictable, self.rate, rank_scale=_RANK_SCALE)
        self._regimes = regimes
        self._weights = weights
        self._clock = clock
        self._regime = 0

    def rate(self, entry: Entry) -> float:
        """`entry`'s request rate per block in the current regime (relative: its Zipf weight)."""
        weights = self._weights[self._regime] if self._weights else {}
        return weights.get(entry.key, 0.0) / max(1, entry.rows)

    def listed(self, entry: Entry) -> None:
        self._follow()
        super().listed(entry)

    def victims(self, needed: int, protect: Container[str]) -> list[Entry]:
        self._follow()
        return super().victims(needed, protect)

    def _follow(self) -> None:
        pos = max(0, self._clock.pos)
        regime = self._regimes[min(pos, len(self._regimes) - 1)] if self._regimes else 0
        if regime != self._regime:
            self._regime = regime
            self._rekey()


@dataclass(frozen=True, slots=True)
class TraceLaw:
    """What `posterior` knows of a trace: each request's key and regime by position (it reads them
    up to the driver's clock only) and each regime's Zipf exponent and pool size."""

    keys: tuple[str, ...]
    regimes: tuple[int, ...]
    zipf: tuple[tuple[float, int], ...]


def law_of(trace: Trace) -> TraceLaw | None:
    """`trace`'s law, or None when a requested key is in no ranking of its regime (a one-off: the
    law would need its share too)."""
    regimes = regimes_of(trace)
    keys = tuple(item.key for item in trace.items())
    ranked = [frozenset(ranking) for _, _, ranking in trace.rankings]
    if not ranked or any(key not in ranked[r] for r, key in zip(regimes, keys, strict=True)):
        return None
    return TraceLaw(
        keys, tuple(regimes), tuple((alpha, len(ranking)) for _, alpha, ranking in trace.rankings)
    )


class PosteriorPolicy:
    """Online, knowing the trace's law: the evictable entry of lowest posterior mean request
    probability per block goes first, the oldest queued first among equals (module docstring).
    It counts the requests up to the driver's clock itself, so the table's calls carry nothing."""

    name = "posterior"

    def __init__(
        self, evictable: Mapping[str, Entry], law: TraceLaw, clock: RequestClock, *, per_block: bool = True
    ) -> None:
        self._evictable = evictable
        self._per_block = per_block
        self._keys = law.keys
        self._regimes = law.regimes
        self._probs = []
        for alpha, pool in law.zipf:
            weights = 1.0 / np.arange(1, pool + 1, dtype=np.float64) ** alpha
            self._probs.append(weights / weights.sum())
        self._clock = clock
        self._counted = -1  # the last position counted
        self._regime = 0
        self._start = 0  # the current regime's first position
        self._counts: dict[str, int] = {}  # requests of each key in the current regime so far
        self._means: dict[int, float] = {}  # n -> posterior mean, for the current (regime, N)
        self._means_at = (-1, -1)

    def reserved(self, entry: Entry) -> None:
        pass

    def listed(self, entry: Entry) -> None:
        pass

    def read(self, entry: Entry) -> None:
        pass

    def freed(self, entry: Entry) -> None:
        pass

    def queued(self) -> int:
        return len(self._evictable)

    def victims(self, needed: int, protect: Container[str]) -> list[Entry]:
        self._follow()
        scored = sorted(
            (self.score(e), e.order, e.key) for e in self._evictable.values() if e.key not in protect
        )
        out: list[Entry] = []
        for _, _, key in scored:
            if needed <= 0:
                break
            entry = self._evictable[key]
            out.append(entry)
            needed -= entry.rows
        return out

    def rank(self, entry: Entry) -> tuple[int, int]:
        self._follow()
        return (math.floor(self.score(entry) * _RANK_SCALE), entry.order)

    def score(self, entry: Entry) -> float:
        """`entry`'s posterior mean request probability per block (per entry without
        `per_block`), as of the clock."""
        mean = self.mean(self._counts.get(entry.key, 0))
        return mean / max(1, entry.rows) if self._per_block else mean

    def mean(self, n: int) -> float:
        """The posterior mean request probability of a key requested `n` times so far in the
        current regime (cached per number of requests seen in it)."""
        seen = self._counted - self._start + 1
        if self._means_at != (self._regime, seen):
            self._means_at = (self._regime, seen)
            self._means = {}
        if n not in self._means:
            p = self._probs[self._regime]
            log_like = n * np.log(p) + max(0, seen - n) * np.log1p(-p)
            w = np.exp(log_like - log_like.max())
            self._means[n] = float((w * p).sum() / w.sum())
        return self._means[n]

    def _follow(self) -> None:
        pos = min(self._clock.pos, len(self._keys) - 1)
        while self._counted < pos:
            self._counted += 1
            regime = self._regimes[self._counted]
            if regime != self._regime:
                self._regime, self._start = regime, self._counted
                self._counts = {}
            key = self._keys[self._counted]
            self._counts[key] = self._counts.get(key, 0) + 1


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
