"""Adaptive eviction candidates for bench/eviction.py: policies that learn from their own misses
how far to trust frequency over recency. Not shipped (docs/eviction.md gives their figures).

- `lecar`: two experts order the same entries, least recently used (LRU) and least frequently
  used (`LfuPolicy`'s counts with a ghost of counts and slow aging). Each eviction follows one of
  them, chosen by weights; a key evicted by an expert is remembered in that expert's history, and
  a reservation of a key still there (the expert's eviction was a mistake: the key was wanted
  again) lowers that expert's weight, by more the sooner the key came back. After Vietri et al.,
  "Driving Cache Replacement with ML-based LeCaR" (HotStorage '18); the choice is deterministic
  here (error diffusion of the weight instead of a random draw), so a replay is reproducible.

On stationary popularity the LRU expert's evictions come back more often than the LFU expert's,
and the policy acts as LFU; when popularity moves, LFU evicts the newly popular keys (low counts),
they come back, and the LRU expert (which evicts the stale high-count keys) takes over.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Container, Mapping

from bench.eviction_candidates import LfuPolicy, _Counted
from ec_connector.domain.entries import Entry

LEARNING_RATE = 0.45  # LeCaR's lambda: how much one regret moves the weights
MIN_WEIGHT = 0.001  # neither expert is ruled out, so its weight can come back when popularity moves
_LRU, _LFU = 0, 1


class LeCarPolicy(LfuPolicy):
    """LRU and LFU experts weighted by their regrets (module docstring). Every operation is O(1)
    amortised: the LRU order is an OrderedDict, the LFU order `LfuPolicy`'s count queues; a victim
    taken by one expert leaves the other's order at once (LRU) or lazily (LFU, by its stamp).
    Histories keep up to `history_share` x the region's blocks of keys each."""

    name = "lecar"

    def __init__(
        self,
        num_blocks: int,
        evictable: Mapping[str, Entry],
        *,
        history_share: float = 1.0,
        learning_rate: float = LEARNING_RATE,
        ghost_share: float = 4.0,
        age: float = 10.0,
        min_weight: float = MIN_WEIGHT,
        lru_weight: float = 0.5,
    ) -> None:
        super().__init__(num_blocks, evictable, ghost_share=ghost_share, age=age)
        self._min_weight = min_weight
        self._lru: OrderedDict[str, _Counted] = OrderedDict()  # front: least recently used
        self._history: tuple[OrderedDict[str, tuple[int, int]], ...] = (OrderedDict(), OrderedDict())
        self._history_rows = [0, 0]
        self._history_limit = max(1, int(num_blocks * history_share))
        self._rate = learning_rate
        self._weight = lru_weight  # the LRU expert's; the LFU expert's is 1 - it
        self._credit = 0.0  # error diffusion of the LRU expert's share of evictions
        self._chosen: dict[str, int] = {}  # victims taken and not yet freed -> the expert that chose
        self._time = 0  # reservations and reads seen

    @property
    def lru_weight(self) -> float:
        """The LRU expert's weight (0-1); the LFU expert's is 1 minus it."""
        return self._weight

    def reserved(self, entry: Entry) -> None:
        self._time += 1
        for expert, history in enumerate(self._history):
            found = history.pop(entry.key, None)
            if found is not None:
                rows, when = found
                self._history_rows[expert] -= rows
                self._regret(expert, self._time - when)
        super().reserved(entry)

    def read(self, entry: Entry) -> None:
        self._time += 1
        super().read(entry)
        if entry.key in self._lru:
            self._lru.move_to_end(entry.key)

    def listed(self, entry: Entry) -> None:
        super().listed(entry)
        node = self._nodes[entry.key]
        self._lru.setdefault(entry.key, node)

    def freed(self, entry: Entry) -> None:
        super().freed(entry)
        self._lru.pop(entry.key, None)
        expert = self._chosen.pop(entry.key, None)
        if expert is not None:
            self._remember(expert, entry)

    def victims(self, needed: int, protect: Container[str]) -> list[Entry]:
        out: list[Entry] = []
        while needed > 0:
            self._credit += self._weight
            expert = _LRU if self._credit >= 1.0 else _LFU
            if expert == _LRU:
                self._credit -= 1.0
            node = self._from_lru(protect) if expert == _LRU else self._next(protect)
            if node is None:  # cannot happen: both experts order the same evictable entries
                raise AssertionError("victims() called with too few evictable blocks")
            node.stamp = 0  # its LFU queue item is stale now
            self._lru.pop(node.entry.key, None)
            self._chosen[node.entry.key] = expert
            out.append(node.entry)
            needed -= node.entry.rows
        return out

    def queued(self) -> int:
        return super().queued() + len(self._lru)

    def rank(self, entry: Entry) -> tuple[int, int]:
        if self._weight >= 0.5:
            return (0, entry.order)  # the LRU expert leads: the table's queue number is recency
        return super().rank(entry)

    # --- internals -----------------------------------------------------------------------------

    def _from_lru(self, protect: Container[str]) -> _Counted | None:
        """The least recently used evictable entry; held ones met on the way go to the back."""
        lru, evictable = self._lru, self._evictable
        for _ in range(len(lru)):
            key, node = next(iter(lru.items()))
            if evictable.get(key) is node.entry and key not in protect:
                return node
            lru.move_to_end(key)
        return None

    def _regret(self, expert: int, age: int) -> None:
        """`expert` evicted a key wanted again `age` accesses later: lower its weight, by more the
        sooner (LeCaR's reward, discounted to 0.005 after as many accesses as entries held). The
        penalty is divided by the expert's share of evictions (an importance weight, as in EXP3):
        an expert followed more often makes more regrets for that alone, and without it the
        weights drift to an even split whichever expert is better."""
        held = max(1, len(self._nodes))
        reward = 0.005 ** (age / held)
        lru, lfu = self._weight, 1.0 - self._weight
        share = lru if expert == _LRU else lfu
        penalty = math.exp(-self._rate * reward / share)
        if expert == _LRU:
            lru *= penalty
        else:
            lfu *= penalty
        self._weight = min(1.0 - self._min_weight, max(self._min_weight, lru / (lru + lfu)))

    def _remember(self, expert: int, entry: Entry) -> None:
        history = self._history[expert]
        history[entry.key] = (entry.rows, self._time)
        self._history_rows[expert] += entry.rows
        while self._history_rows[expert] > self._history_limit:
            _, (rows, _when) = history.popitem(last=False)
            self._history_rows[expert] -= rows
