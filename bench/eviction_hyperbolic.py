"""Hyperbolic caching, counted in blocks: an eviction candidate for bench/eviction.py, not shipped.

After Blankstein, Sen and Freedman, "Hyperbolic Caching: Flexible Caching for Web Applications"
(USENIX ATC '17). Each entry's priority is its reads per unit of time in the region:

    priority = requests since admission / (now - admission + 1 + prior x entries held)

with `now` a logical clock of accesses (reservations and reads), and a reservation counting as
the first request. `prior` 0 is the paper's form: a newly admitted entry starts at priority 1
and stays above an entry of rate r for about 1/r accesses, so where every rate is far below one
request per entries held (flat popularity), one-off images stay about as long as under FIFO (0.99x
its misses on zipf 0.6, 1,000 steps); with a prior of some entries held, a young entry is judged
by its count, as under LFU, until its age dominates. A victim is the entry of lowest priority
among a random sample of `sample` listed entries (the paper's sampling: no order is kept, so an
access costs O(1) and a victim O(sample)); held entries (pinned, granted, announced, not READY,
protected by the caller) are skipped, never taken. `size_aware` divides the priority by the
entry's blocks (the paper's size-aware variant: the request rate an entry earns per block it
holds).

A **ghost** remembers an evicted key's count and admission time (up to `ghost_share` x the
region's blocks of keys, oldest dropped first); a reservation of a key still there restores them
(count + 1), so its rate is measured over its whole life instead of starting afresh (the paper's
restoring of evicted items' metadata). `horizon` (a multiple of the entries held, None: no limit)
bounds how far back a rate is measured: an entry whose age passes it keeps its rate and has its
count and age scaled down to the horizon at its next access, so what it did long ago weighs
less against what it does next.

Replays are reproducible: the sample is drawn by a `random.Random` seeded at construction.

Also here: the names under which bench/eviction.py replays these candidates, `lecar-tuned` (the
shipped `LeCarPolicy` with other settings) and bench/eviction_decayed.py's (`make_candidate`).
"""

from __future__ import annotations

import random
from collections.abc import Container, Mapping

from bench.eviction_candidates import BlockGhost, Settings, flag, policy_settings
from bench.eviction_decayed import make_decayed
from ec_connector.domain.entries import Entry
from ec_connector.domain.eviction import EvictionPolicy
from ec_connector.domain.eviction_lecar import LeCarPolicy

SAMPLE = 64
GHOST_SHARE = 4.0
PRIOR = 16.0  # the paper's form: 0
_RANK_SCALE = 1 << 40  # `rank`'s integer priority: priorities are at most 1


class _Hyp:
    """An entry's count, admission time and place in the policy's array of listed entries."""

    __slots__ = ("entry", "count", "since", "slot")

    def __init__(self, entry: Entry, count: float, since: int) -> None:
        self.entry = entry
        self.count = count
        self.since = since
        self.slot = -1  # index in `_listed`; -1: not listed (never READY, or taken as a victim)


class HyperbolicPolicy:
    """Hyperbolic caching with a sample of `sample` entries a victim (module docstring)."""

    name = "hyperbolic"

    def __init__(
        self,
        num_blocks: int,
        evictable: Mapping[str, Entry],
        *,
        sample: int = SAMPLE,
        size_aware: bool = False,
        ghost_share: float = GHOST_SHARE,
        horizon: float | None = None,
        prior: float = PRIOR,
        seed: int = 0,
    ) -> None:
        self._evictable = evictable
        self._sample = max(1, sample)
        self._size_aware = size_aware
        self._horizon = horizon
        self._prior = prior
        self._nodes: dict[str, _Hyp] = {}
        self._listed: list[_Hyp] = []
        self._ghost = BlockGhost(int(num_blocks * ghost_share))  # key -> (count, since)
        self._rng = random.Random(seed)
        self._time = 0

    def priority(self, entry: Entry) -> float:
        """`entry`'s priority now: requests per access since admission (per block if size-aware)."""
        node = self._nodes[entry.key]
        return self._priority(node)

    def reserved(self, entry: Entry) -> None:
        self._time += 1
        found = self._ghost.pop(entry.key)
        if found is None:
            node = _Hyp(entry, 1.0, self._time)
        else:
            count, since = found
            node = _Hyp(entry, count + 1.0, since)
            self._shorten(node)
        self._nodes[entry.key] = node

    def listed(self, entry: Entry) -> None:
        node = self._nodes[entry.key]
        if node.slot < 0:
            node.slot = len(self._listed)
            self._listed.append(node)

    def read(self, entry: Entry) -> None:
        self._time += 1
        node = self._nodes[entry.key]
        node.count += 1.0
        self._shorten(node)

    def freed(self, entry: Entry) -> None:
        node = self._nodes.pop(entry.key)
        self._unlist(node)
        self._ghost.add(entry.key, entry.rows, (node.count, node.since))

    def victims(self, needed: int, protect: Container[str]) -> list[Entry]:
        out: list[Entry] = []
        while needed > 0:
            node = self._pick(protect)
            assert node is not None, "victims() called with too few evictable blocks"
            self._unlist(node)
            out.append(node.entry)
            needed -= node.entry.rows
        return out

    def queued(self) -> int:
        return len(self._listed)

    def rank(self, entry: Entry) -> tuple[int, int]:
        return (int(self.priority(entry) * _RANK_SCALE), entry.order)

    # --- internals -----------------------------------------------------------------------------

    def _priority(self, node: _Hyp) -> float:
        age = self._time - node.since + 1 + self._prior * len(self._nodes)
        if self._size_aware:
            return node.count / (age * node.entry.rows)
        return node.count / age

    def _shorten(self, node: _Hyp) -> None:
        """Scale an entry's count and age down to the horizon, keeping its rate (module docstring)."""
        if self._horizon is None:
            return
        limit = self._horizon * max(1, len(self._nodes))
        age = self._time - node.since + 1
        if age > limit:
            node.count *= limit / age
            node.since = self._time + 1 - int(limit)

    def _usable(self, node: _Hyp, protect: Container[str]) -> bool:
        entry = node.entry
        return self._evictable.get(entry.key) is entry and entry.key not in protect

    def _pick(self, protect: Container[str]) -> _Hyp | None:
        """The lowest-priority usable entry of a random sample; held entries drawn are skipped. When
        a sample (and as many draws again) finds none usable, a walk from a random place finds the
        first that is (most of the region held: the walk passes only held entries)."""
        listed = self._listed
        if not listed:
            return None
        best: _Hyp | None = None
        best_p = 0.0
        draws = 0
        found = 0
        randrange = self._rng.randrange
        size = len(listed)
        while found < self._sample and draws < 2 * self._sample:
            draws += 1
            node = listed[randrange(size)]
            if not self._usable(node, protect):
                continue
            found += 1
            p = self._priority(node)
            if best is None or p < best_p or (p == best_p and node.entry.order < best.entry.order):
                best, best_p = node, p
        if best is not None:
            return best
        start = randrange(size)
        for i in range(size):
            node = listed[(start + i) % size]
            if self._usable(node, protect):
                return node
        return None

    def _unlist(self, node: _Hyp) -> None:
        """Take `node` out of the array of listed entries (the last one fills its slot)."""
        slot = node.slot
        if slot < 0:
            return
        listed = self._listed
        last = listed.pop()
        if last is not node:
            listed[slot] = last
            last.slot = slot
        node.slot = -1


# --- names the bench replays -------------------------------------------------------------------

_HYPERBOLIC_KEYS: Settings = {
    "k": ("sample", int),
    "size": ("size_aware", flag),
    "ghost": ("ghost_share", float),
    "horizon": ("horizon", float),
    "prior": ("prior", float),
    "seed": ("seed", int),
}
_LECAR_KEYS: Settings = {
    "rate": ("learning_rate", float),
    "discount": ("discount", float),
    "age": ("age", float),
    "history": ("history_share", float),
    "ghost": ("ghost_share", float),
    "min": ("min_weight", float),
    "lru": ("lru_weight", float),
}


def is_candidate(name: str) -> bool:
    """Whether `name` is one of this module's candidates (`make_candidate` replays it)."""
    base = name.partition(":")[0]
    return base in ("hyperbolic", "hyperbolic-size", "lecar-tuned") or base.startswith("decayed")


def make_candidate(name: str, num_blocks: int, evictable: Mapping[str, Entry]) -> EvictionPolicy:
    """The policy a bench name stands for: `hyperbolic[:k=K,size=0|1,ghost=G,horizon=H,seed=S]`,
    `hyperbolic-size[:...]` (size-aware), `lecar-tuned[:rate=,discount=,age=,history=,ghost=,
    min=,lru=]`, `decayed[:...]` (bench/eviction_decayed.py)."""
    base = name.partition(":")[0]
    if base in ("hyperbolic", "hyperbolic-size"):
        kw = {"size_aware": base == "hyperbolic-size", **policy_settings(name, _HYPERBOLIC_KEYS)}
        return HyperbolicPolicy(num_blocks, evictable, **kw)
    if base == "lecar-tuned":
        return LeCarPolicy(num_blocks, evictable, **policy_settings(name, _LECAR_KEYS))
    if base.startswith("decayed"):
        return make_decayed(name, num_blocks, evictable)
    raise ValueError(f"unknown candidate {name!r}")
