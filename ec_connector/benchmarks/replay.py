"""Replaying a cache trace through one side (our EntryTable, vLLM's EmbeddingCache), and the
offline policy the eviction benches measure against: the driver of bench/eviction.py and of the
serving bench's expected hit ratios (serving_expected.py).

`replay_hits` serves a trace step by step: per step, saves become ready (or are discarded when
the item's save fails) and loads unpin, then each arriving item is looked up: ready -> a hit
(pinned for a step), absent -> a miss (reserved, may evict), not ready -> waits (neither).
`BeladyPolicy` evicts the evictable entry requested again farthest in the future (Belady's MIN,
sizes in blocks); it knows the whole trace (`request_positions`) and where the replay is
(`RequestClock`), so it is a reference, not a policy a server can run; it and the eviction
bench's other offline orders are `LazyHeapOrder`s.
"""

from __future__ import annotations

import heapq
import math
import time
from bisect import bisect_right
from collections.abc import Callable, Container, Mapping
from typing import Any

from ec_connector.benchmarks.cache_sides import ABSENT, READY
from ec_connector.benchmarks.cache_traces import Trace
from ec_connector.domain.entries import Entry

_NEVER = 1 << 62  # the next request of an item that is never requested again


class RequestClock:
    """The driver's position: the index of the request being served (requests in trace order)."""

    __slots__ = ("pos",)

    def __init__(self) -> None:
        self.pos = -1


def request_positions(trace: Trace) -> dict[str, list[int]]:
    """Each item's request indices, ascending, in the order `replay_hits` serves
    them (steps in order, requests of a step in arrival order)."""
    out: dict[str, list[int]] = {}
    for pos, item in enumerate(trace.items()):
        out.setdefault(item.key, []).append(pos)
    return out


class LazyHeapOrder:
    """An offline order: the evictable entry of lowest `key(entry)` goes first, the oldest listed
    first among equals. An entry's key is taken when it becomes evictable and must not change while
    it stays so (a request pins it first, which takes it out); a min-heap with lazy deletion,
    compacted when stale items outnumber live ones, and rebuilt by `_rekey` when every key moves.
    `rank` is the key times `rank_scale`, whole."""

    def __init__(
        self, evictable: Mapping[str, Entry], key: Callable[[Entry], float], *, rank_scale: float = 1.0
    ) -> None:
        self._evictable = evictable
        self._key = key
        self._rank_scale = rank_scale
        self._heap: list[tuple[float, int, str]] = []  # (key, stamp, entry key)
        self._stamps: dict[str, int] = {}
        self._stamp = 0

    def reserved(self, entry: Entry) -> None:
        pass

    def read(self, entry: Entry) -> None:
        pass

    def freed(self, entry: Entry) -> None:
        self._stamps.pop(entry.key, None)

    def listed(self, entry: Entry) -> None:
        self._stamp += 1
        self._stamps[entry.key] = self._stamp
        heapq.heappush(self._heap, (self._key(entry), self._stamp, entry.key))
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
        return (math.floor(self._key(entry) * self._rank_scale), entry.order)

    def _rekey(self) -> None:
        """Every listed entry's key anew (what the order knows has changed for all of them)."""
        self._heap = [
            (self._key(self._evictable[k]), stamp, k)
            for k, stamp in self._stamps.items()
            if k in self._evictable
        ]
        heapq.heapify(self._heap)


class BeladyPolicy(LazyHeapOrder):
    """Offline: the evictable entry requested again farthest in the future goes first (never
    requested again: first of all)."""

    name = "belady"

    def __init__(
        self, evictable: Mapping[str, Entry], positions: Mapping[str, list[int]], clock: RequestClock
    ) -> None:
        super().__init__(evictable, lambda entry: -self.next_request(entry.key))
        self._positions = positions
        self._clock = clock

    def next_request(self, key: str) -> int:
        uses = self._positions.get(key, ())
        i = bisect_right(uses, self._clock.pos)
        return uses[i] if i < len(uses) else _NEVER


def replay_hits(
    side: Any, trace: Trace, clock: RequestClock | None = None, *, count_from: int = 0
) -> dict[str, float]:
    """Hits and misses (items and blocks) of `trace` against `side`, and the replay's seconds.
    `clock`, if given, is set to each request's index before it is served (for offline policies).
    Requests before index `count_from` are served but not counted (a warm-up that fills the
    region)."""
    hits = misses = hit_rows = miss_rows = 0
    pos = -1
    to_ready: list = []
    to_unpin: list[str] = []
    t0 = time.perf_counter()
    for n, step in enumerate(trace.steps):
        side.tick(n * 0.02)
        saves, to_ready = to_ready, []
        for item in saves:
            if item.fails:
                side.discard(item.key)
            else:
                side.ready(item.key)
        loads, to_unpin = to_unpin, []
        for key in loads:
            side.unpin(key)
        for _, items in step.arrivals:
            for item in items:
                pos += 1
                if clock is not None:
                    clock.pos = pos
                counted = pos >= count_from
                state = side.lookup(item.key)
                if state == READY:
                    side.pin(item.key)
                    to_unpin.append(item.key)
                    hits += counted
                    hit_rows += item.rows * counted
                elif state == ABSENT:
                    misses += counted
                    miss_rows += item.rows * counted
                    if side.alloc(item.key, item.rows):
                        to_ready.append(item)
    wall = time.perf_counter() - t0
    return {
        "miss_ratio": misses / max(1, hits + misses),
        "byte_miss_ratio": miss_rows / max(1, hit_rows + miss_rows),
        "hits": hits,
        "misses": misses,
        "replay_s": wall,
    }
