"""Exponentially decayed frequency (LRFU / CRF), counted in blocks: an eviction candidate for
bench/eviction.py, not shipped.

After Lee et al., "LRFU: A Spectrum of Policies that Subsumes the Least Recently Used and Least
Frequently Used Policies" (IEEE ToC 2001). Each entry's score is the sum over its requests
(reservation and reads) of `2 ** (-lam x their age)`; the entry of lowest score goes first.
`lam` -> 0 is LFU, a large `lam` is LRU. Time is a logical clock of the blocks accessed (an
access of an entry advances it by the entry's rows), so the half-life `half_life` is a multiple
of the region's blocks: `lam = 1 / (half_life x blocks)`, fixed at construction.

Without a new request two entries' scores decay by the same factor, so their order never
changes: an entry's heap key `log2(score at its last request) + lam x that request's time` is
fixed between its requests, and a min-heap with lazy deletion orders them (O(log entries) per
access and victim; held entries popped on the way go back once the victims are found). A ghost
keeps an evicted key's score and time (up to `ghost_share` x the region's blocks of keys, oldest
dropped first): a reservation of a key still there resumes its decayed score. `size_aware`
divides the score by the entry's blocks (its key minus log2 of them).

No one half-life serves both stationary and drifting popularity (a long one is LFU, which is up
to 5 points above FIFO where popularity is re-ranked; a short one is near LRU), so
`AdaptiveDecayedPolicy` (`decayed-adaptive`) replays one shadow region per half-life of
`HALF_LIVES` on the same requests and follows the shadow whose hits over the followed one's are
clearly more than chance (a sequential test: the decayed sum of the requests where the two
differ, won minus lost, above `z` times the square root of their count).

`ClimbingDecayedPolicy` (`decayed-climb`) chooses without shadows, stepping along the half-lives by
its own hit ratio from one sample to the next (docs/eviction.md: dropped, it misleads itself where
popularity drifts).
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections import OrderedDict
from collections.abc import Container, Mapping

from bench.eviction_candidates import BlockGhost, Settings, flag, policy_settings
from ec_connector.domain.entries import Entry

HALF_LIFE = 4.0  # in region's worth of blocks accessed
GHOST_SHARE = 4.0
_RANK_SCALE = 1 << 20


class _Decayed:
    __slots__ = ("entry", "score", "when", "key", "seq")

    def __init__(self, entry: Entry, score: float, when: float) -> None:
        self.entry = entry
        self.score = score  # at `when`
        self.when = when
        self.key = 0.0
        self.seq = 0  # the live heap item's sequence number; 0: not in the heap, -1: taken or freed


class DecayedPolicy:
    """Lowest exponentially decayed request count first (module docstring)."""

    name = "decayed"

    def __init__(
        self,
        num_blocks: int,
        evictable: Mapping[str, Entry],
        *,
        half_life: float = HALF_LIFE,
        ghost_share: float = GHOST_SHARE,
        size_aware: bool = False,
    ) -> None:
        self._evictable = evictable
        self._lam = 1.0 / (half_life * max(1, num_blocks))
        self._size_aware = size_aware
        self._nodes: dict[str, _Decayed] = {}
        self._heap: list[tuple[float, int, _Decayed]] = []
        self._seq = 0
        self._time = 0.0
        self._ghost = BlockGhost(int(num_blocks * ghost_share))  # key -> (score, when)

    def score(self, entry: Entry) -> float:
        """`entry`'s decayed request count now."""
        node = self._nodes[entry.key]
        return node.score * 2.0 ** (-self._lam * (self._time - node.when))

    def reserved(self, entry: Entry) -> None:
        self._time += entry.rows
        found = self._ghost.pop(entry.key)
        node = _Decayed(entry, 0.0, self._time)
        if found is not None:
            node.score, node.when = found
        self._nodes[entry.key] = node
        self._count(node)

    def listed(self, entry: Entry) -> None:
        node = self._nodes[entry.key]
        if node.seq == 0:
            self._push(node)

    def read(self, entry: Entry) -> None:
        self._time += entry.rows
        node = self._nodes[entry.key]
        self._count(node)
        if node.seq > 0:
            self._push(node)

    def freed(self, entry: Entry) -> None:
        node = self._nodes.pop(entry.key)
        node.seq = -1
        self._ghost.add(entry.key, entry.rows, (node.score, node.when))

    def victims(self, needed: int, protect: Container[str]) -> list[Entry]:
        out: list[Entry] = []
        held: list[tuple[float, int, _Decayed]] = []
        heap, evictable = self._heap, self._evictable
        while needed > 0:
            assert heap, "victims() called with too few evictable blocks"
            item = heapq.heappop(heap)
            node = item[2]
            if node.seq != item[1]:
                continue  # stale
            entry = node.entry
            if evictable.get(entry.key) is not entry or entry.key in protect:
                held.append(item)
                continue
            node.seq = -1
            out.append(entry)
            needed -= entry.rows
        for item in held:
            heapq.heappush(heap, item)
        return out

    def queued(self) -> int:
        return len(self._heap)

    def rank(self, entry: Entry) -> tuple[int, int]:
        node = self._nodes[entry.key]
        return (math.floor(node.key * _RANK_SCALE), entry.order)

    # --- internals -----------------------------------------------------------------------------

    def _count(self, node: _Decayed) -> None:
        """One more request of `node` now: decay its score to now, add 1, refresh its key."""
        now = self._time
        node.score = node.score * 2.0 ** (-self._lam * (now - node.when)) + 1.0
        node.when = now
        key = math.log2(node.score) + self._lam * now
        if self._size_aware:
            key -= math.log2(node.entry.rows)
        node.key = key

    def _rekey(self, lam: float) -> None:
        """Follow `lam` from now: every score decays to now under the old one, then keys are made
        under the new one (their order is the new half-life's from here on)."""
        now, old = self._time, self._lam
        self._lam = lam
        heap: list[tuple[float, int, _Decayed]] = []
        for node in self._nodes.values():
            node.score *= 2.0 ** (-old * (now - node.when))
            node.when = now
            node.key = math.log2(node.score) + lam * now
            if self._size_aware:
                node.key -= math.log2(node.entry.rows)
            if node.seq > 0:
                self._seq += 1
                node.seq = self._seq
                heap.append((node.key, self._seq, node))
        heapq.heapify(heap)
        self._heap = heap
        self._ghost.remap(lambda record: (record[0] * 2.0 ** (-old * (now - record[1])), now))

    def _push(self, node: _Decayed) -> None:
        self._seq += 1
        node.seq = self._seq
        heap = self._heap
        heapq.heappush(heap, (node.key, self._seq, node))
        if len(heap) > 64 + 2 * len(self._nodes):
            heap[:] = [item for item in heap if item[2].seq == item[1]]
            heapq.heapify(heap)


HALF_LIVES: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
WINDOW = 4.0  # the shadows' hits are counted with a half-life of this many x the entries held
Z = 1.0  # a shadow is followed once its gain over the followed one is this many x its noise


class _Shadow:
    """A region of the same blocks replayed with one half-life on the same requests, without the
    table (no pins, no saves in flight): it only counts its hits. A heap with lazy deletion as
    `DecayedPolicy`'s, and a ghost of scores as large."""

    __slots__ = (
        "lam",
        "capacity",
        "size_aware",
        "used",
        "resident",
        "ghost",
        "heap",
        "seq",
        "ghost_rows",
        "ghost_limit",
    )

    def __init__(self, lam: float, capacity: int, ghost_limit: int, size_aware: bool) -> None:
        self.lam = lam
        self.size_aware = size_aware
        self.capacity = capacity
        self.used = 0
        self.resident: dict[str, tuple[int, int, float, float]] = {}  # key -> seq, rows, score, when
        self.ghost: OrderedDict[str, tuple[int, float, float]] = OrderedDict()  # key -> rows, score, when
        self.heap: list[tuple[float, int, str]] = []
        self.seq = 0
        self.ghost_rows = 0
        self.ghost_limit = ghost_limit

    def request(self, key: str, rows: int, now: float) -> bool:
        """One request of `key` at `now`: True on a hit; a miss admits it, evicting the lowest."""
        lam = self.lam
        found = self.resident.get(key)
        hit = found is not None
        if found is not None:
            score, when = found[2], found[3]
        else:
            old = self.ghost.pop(key, None)
            score, when = (0.0, now) if old is None else (old[1], old[2])
            if old is not None:
                self.ghost_rows -= old[0]
            if rows > self.capacity:
                return False
            while self.used + rows > self.capacity:
                self._evict()
            self.used += rows
        score = score * 2.0 ** (-lam * (now - when)) + 1.0
        self.seq += 1
        self.resident[key] = (self.seq, rows, score, now)
        key_value = math.log2(score) + lam * now
        if self.size_aware:
            key_value -= math.log2(rows)
        heapq.heappush(self.heap, (key_value, self.seq, key))
        if len(self.heap) > 64 + 2 * len(self.resident):
            self.heap = [item for item in self.heap if self.resident.get(item[2], (0,))[0] == item[1]]
            heapq.heapify(self.heap)
        return hit

    def _evict(self) -> None:
        resident = self.resident
        while True:
            _, seq, key = heapq.heappop(self.heap)
            found = resident.get(key)
            if found is not None and found[0] == seq:
                break
        _, rows, score, when = resident.pop(key)
        self.used -= rows
        self.ghost[key] = (rows, score, when)
        self.ghost_rows += rows
        while self.ghost_rows > self.ghost_limit:
            _, (old_rows, _score, _when) = self.ghost.popitem(last=False)
            self.ghost_rows -= old_rows


class _GridDecayedPolicy(DecayedPolicy):
    """`DecayedPolicy` that follows one half-life of `half_lives` at a time (`half_lives[start]`
    first, the longest by default); a subclass chooses among them as each request comes
    (`_requested`) and moves with `_follow`."""

    def __init__(
        self,
        num_blocks: int,
        evictable: Mapping[str, Entry],
        *,
        half_lives: tuple[float, ...],
        start: int | None,
        ghost_share: float,
        size_aware: bool,
    ) -> None:
        first = (len(half_lives) - 1 if start is None else start) % len(half_lives)
        super().__init__(
            num_blocks, evictable, half_life=half_lives[first], ghost_share=ghost_share, size_aware=size_aware
        )
        self._half_lives = half_lives
        self._grid = [1.0 / (h * max(1, num_blocks)) for h in half_lives]
        self._at = first

    @property
    def half_life(self) -> float:
        """The half-life followed now, in the region's blocks accessed."""
        return self._half_lives[self._at]

    def reserved(self, entry: Entry) -> None:
        super().reserved(entry)
        self._requested(entry, hit=False)

    def read(self, entry: Entry) -> None:
        super().read(entry)
        self._requested(entry, hit=True)

    def _requested(self, entry: Entry, *, hit: bool) -> None:
        """One request of `entry` (a read is a hit, a reservation a miss) was counted; the base
        follows the half-life it has."""

    def _follow(self, at: int) -> None:
        self._at = at
        self._rekey(self._grid[at])


class AdaptiveDecayedPolicy(_GridDecayedPolicy):
    """`DecayedPolicy` whose half-life follows one of shadow regions, one per half-life of
    `half_lives` (starting with `half_lives[start]`, the longest by default), fed the same
    requests. Every `entries held` requests it looks at each shadow's gain over the one it follows
    (requests one hit and the other missed, won minus lost) and at their count, both decayed with
    a half-life of `window` x the entries held: the shadow of most gain is followed once its gain
    is above `z` x the square root of that count (both reset then); `z` 0 instead follows the
    shadow with the most hits unless the followed one has within `margin` of them. A change
    re-keys the heap (O(entries), at most once per entries held requests: O(1) amortised). A
    request costs O(log entries) per shadow, and each shadow keeps its region's keys and a ghost as
    large as the policy's."""

    name = "decayed-adaptive"

    def __init__(
        self,
        num_blocks: int,
        evictable: Mapping[str, Entry],
        *,
        half_lives: tuple[float, ...] = HALF_LIVES,
        window: float = WINDOW,
        ghost_share: float = GHOST_SHARE,
        size_aware: bool = False,
        start: int | None = None,
        margin: float = 0.0,
        z: float = Z,
        shard: float = 1.0,
    ) -> None:
        super().__init__(
            num_blocks,
            evictable,
            half_lives=half_lives,
            start=start,
            ghost_share=ghost_share,
            size_aware=size_aware,
        )
        self._shard = min(1.0, max(1e-3, shard))
        self._shard_below = int(self._shard * 2**32)
        shadow_blocks = max(1, int(num_blocks * self._shard))
        ghost_limit = int(shadow_blocks * ghost_share)
        self._shadows = [_Shadow(lam, shadow_blocks, ghost_limit, size_aware) for lam in self._grid]
        self._hits = [0.0] * len(half_lives)
        self._window = window
        self._margin = margin
        self._z = z
        self._gain = [0.0] * len(half_lives)  # decayed sum of (its hit - the followed one's hit)
        self._disagree = [0.0] * len(half_lives)  # decayed count of requests where the two differ
        self._since_choice = 0

    def _requested(self, entry: Entry, *, hit: bool) -> None:
        held = max(1, len(self._nodes))
        self._since_choice += 1
        if self._shard >= 1.0 or zlib.crc32(entry.key.encode()) < self._shard_below:
            self._fed(entry, held)
        if self._since_choice < held:
            return
        self._since_choice = 0
        self._choose()

    def _fed(self, entry: Entry, held: int) -> None:
        """The shadows serve `entry`'s request; the gains and counts decay by one request's worth."""
        keep = 2.0 ** (-1.0 / (self._window * held * self._shard))
        now = self._time
        hits, gain, disagree = self._hits, self._gain, self._disagree
        got = [shadow.request(entry.key, entry.rows, now) for shadow in self._shadows]
        ours = got[self._at]
        for i, hit in enumerate(got):
            hits[i] = hits[i] * keep + (1.0 if hit else 0.0)
            gain[i] *= keep
            disagree[i] *= keep
            if hit != ours:
                gain[i] += 1.0 if hit else -1.0
                disagree[i] += 1.0

    def _choose(self) -> None:
        hits, gain, disagree = self._hits, self._gain, self._disagree
        if self._z > 0:
            best = max(range(len(gain)), key=lambda i: gain[i])
            switch = gain[best] > self._z * math.sqrt(disagree[best])
        else:
            best = max(range(len(hits)), key=lambda i: (hits[i], i == self._at))
            switch = hits[best] > hits[self._at] * (1.0 + self._margin)
        if best != self._at and switch:
            self._gain = [0.0] * len(gain)
            self._disagree = [0.0] * len(disagree)
            self._follow(best)


CLIMB_SAMPLE = 4.0  # a climber's sample: this many x the entries held requests


class ClimbingDecayedPolicy(_GridDecayedPolicy):
    """`DecayedPolicy` whose half-life climbs the grid `half_lives` by its own hit ratio, without
    shadows: every `sample x entries held` requests (reads are hits, reservations misses) it takes
    one step along the grid, the same way as the last one when the sample's hit ratio is not below
    the previous sample's by more than `tolerance`, the other way when it is (turning at the grid's
    ends). It starts at `half_lives[start]` (the longest by default) going shorter. A step re-keys
    the heap (O(entries), once per sample: O(1) amortised); a request costs the heap's
    O(log entries) and two counters."""

    name = "decayed-climb"

    def __init__(
        self,
        num_blocks: int,
        evictable: Mapping[str, Entry],
        *,
        half_lives: tuple[float, ...] = HALF_LIVES,
        sample: float = CLIMB_SAMPLE,
        tolerance: float = 0.0,
        start: int | None = None,
        ghost_share: float = GHOST_SHARE,
        size_aware: bool = False,
    ) -> None:
        super().__init__(
            num_blocks,
            evictable,
            half_lives=half_lives,
            start=start,
            ghost_share=ghost_share,
            size_aware=size_aware,
        )
        self._way = -1
        self._sample = sample
        self._tolerance = tolerance
        self._hits = 0
        self._requests = 0
        self._last: float | None = None

    def _requested(self, entry: Entry, *, hit: bool) -> None:
        self._requests += 1
        self._hits += hit
        if self._requests < self._sample * max(1, len(self._nodes)):
            return
        ratio = self._hits / self._requests
        self._hits = self._requests = 0
        if self._last is not None and ratio < self._last - self._tolerance:
            self._way = -self._way
        self._last = ratio
        step = self._at + self._way
        if not 0 <= step < len(self._grid):
            self._way = -self._way
            step = self._at + self._way
        if 0 <= step < len(self._grid):
            self._follow(step)


_DECAYED_KEYS: Settings = {
    "ghost": ("ghost_share", float),
    "size": ("size_aware", flag),
    "half": ("half_life", float),
}
_ADAPTIVE_KEYS: Settings = {
    "ghost": ("ghost_share", float),
    "size": ("size_aware", flag),
    "window": ("window", float),
    "start": ("start", int),
    "halves": ("half_lives", lambda v: tuple(float(h) for h in v.split("/"))),
    "margin": ("margin", float),
    "z": ("z", float),
    "shard": ("shard", float),
}


_CLIMB_KEYS: Settings = {
    "ghost": ("ghost_share", float),
    "size": ("size_aware", flag),
    "sample": ("sample", float),
    "tolerance": ("tolerance", float),
    "start": ("start", int),
    "halves": ("half_lives", lambda v: tuple(float(h) for h in v.split("/"))),
}


def make_decayed(name: str, num_blocks: int, evictable: Mapping[str, Entry]) -> DecayedPolicy:
    """`decayed[:half=H,ghost=G,size=0|1]` (`decayed-size`: size-aware),
    `decayed-climb[:sample=S,tolerance=T,start=I,halves=H1/H2/...,ghost=G,size=0|1]` or
    `decayed-adaptive[:window=W,z=Z,margin=M,shard=R,ghost=G,size=0|1,start=I,halves=H1/H2/...]`
    as a policy."""
    base = name.partition(":")[0]
    if base == "decayed-climb":
        return ClimbingDecayedPolicy(num_blocks, evictable, **policy_settings(name, _CLIMB_KEYS))
    if base == "decayed-adaptive":
        return AdaptiveDecayedPolicy(num_blocks, evictable, **policy_settings(name, _ADAPTIVE_KEYS))
    kw = {"size_aware": base == "decayed-size", **policy_settings(name, _DECAYED_KEYS)}
    return DecayedPolicy(num_blocks, evictable, **kw)
