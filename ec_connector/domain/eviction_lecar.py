"""The `lecar` eviction policy (`ec_eviction = "lecar"`): least recently used (LRU) and least
frequently used (LFU) as two experts, each eviction following one of them in proportion to
weights learnt from the policy's own misses.

- `LfuPolicy` (the LFU expert, and a policy by itself in bench/eviction.py): least frequently used
  first, oldest first among equal counts. Counts (capped at 15) are kept for the entries and, in a
  ghost of up to 4x the region's blocks, for evicted keys; all are halved every 10x the tracked
  keys' accesses, so old popularity fades.
- `LeCarPolicy`: a key evicted by an expert is remembered in that expert's history; a reservation
  of a key still there (the expert's eviction was a mistake: the key was wanted again) lowers that
  expert's weight, by more the sooner the key came back. After Vietri et al., "Driving Cache
  Replacement with ML-based LeCaR" (HotStorage '18); the choice is deterministic (error diffusion
  of the weight instead of a random draw), so a replay is reproducible.

On stationary popularity the LRU expert's evictions come back more often than the LFU expert's,
and the policy acts as LFU; when popularity moves, LFU evicts the newly popular keys (low counts),
they come back, and the LRU expert (which evicts the stale high-count keys) takes over. Every
operation is O(1) amortised (docs/eviction.md gives the figures on the bench's traces).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Container, Mapping
from typing import Generic, Protocol, TypeVar

from ec_connector.domain.entries import Entry

LFU_CAP = 15


class Keyed(Protocol):
    """What the LFU order reads of an item: its key and its size in blocks (an `Entry`, or a key
    of a shadow region)."""

    @property
    def key(self) -> str: ...

    @property
    def rows(self) -> int: ...


ItemT = TypeVar("ItemT", bound=Keyed)


class _Counted(Generic[ItemT]):
    __slots__ = ("entry", "count", "stamp")

    def __init__(self, entry: ItemT, count: int) -> None:
        self.entry = entry
        self.count = count
        self.stamp = 0  # 0: not queued (never READY, or just taken as a victim); -1: freed


class LfuPolicy(Generic[ItemT]):
    """Least frequently used first, oldest first among equal counts. A reservation counts 1 (plus
    the count its key had when it was evicted, if still in the ghost), a read 1 more, capped at
    `LFU_CAP`. Evicted keys keep their count in a ghost of up to `ghost_share` x the region's
    blocks. Every `age x tracked keys` accesses all counts are halved (O(tracked keys), so O(1)
    amortised), so old popularity fades. One queue per count with lazy deletion: a victim costs
    at most the 16 queues' fronts plus the held entries it passes."""

    name = "lfu"

    def __init__(
        self, num_blocks: int, evictable: Mapping[str, ItemT], *, ghost_share: float = 4.0, age: float = 10.0
    ) -> None:
        self._evictable = evictable
        self._nodes: dict[str, _Counted[ItemT]] = {}
        self._queues: list[deque[tuple[int, _Counted[ItemT]]]] = [deque() for _ in range(LFU_CAP + 1)]
        self._items = 0  # items in the count queues, stale ones included
        self._stamp = 0
        self._ghost: OrderedDict[str, tuple[int, int]] = OrderedDict()  # key -> (rows, count)
        self._ghost_rows = 0
        self._ghost_limit = max(1, int(num_blocks * ghost_share))
        self._age = age
        self._accesses = 0

    def reserved(self, entry: ItemT) -> None:
        self._count_in(entry)

    def _count_in(self, entry: ItemT) -> _Counted[ItemT] | None:
        """`reserved`: a node for `entry`, counted 1 plus its key's count in the ghost if there.
        Returns the node if the key was not in the ghost (never seen, or forgotten), else None."""
        rows_count = self._ghost.pop(entry.key, None)
        count = 1
        if rows_count is not None:
            self._ghost_rows -= rows_count[0]
            count = min(LFU_CAP, rows_count[1] + 1)
        node = self._nodes[entry.key] = _Counted(entry, count)
        self._accessed()
        return node if rows_count is None else None

    def read(self, entry: ItemT) -> None:
        node = self._nodes[entry.key]
        if node.count < LFU_CAP:
            node.count += 1
            if node.stamp > 0:
                self._push(node)  # to its new count's queue; the old item is stale now
        self._accessed()

    def listed(self, entry: ItemT) -> None:
        node = self._nodes[entry.key]
        if node.stamp <= 0:
            self._push(node)

    def freed(self, entry: ItemT) -> None:
        node = self._nodes.pop(entry.key)
        node.stamp = -1
        ghost, limit = self._ghost, self._ghost_limit
        ghost[entry.key] = (entry.rows, node.count)
        rows = self._ghost_rows + entry.rows
        while rows > limit:
            rows -= ghost.popitem(False)[1][0]  # the oldest key's (rows, count)
        self._ghost_rows = rows

    def victims(self, needed: int, protect: Container[str]) -> list[ItemT]:
        out: list[ItemT] = []
        while needed > 0:
            node = self._next(protect)
            assert node is not None, "victims() called with too few evictable blocks"
            node.stamp = 0
            out.append(node.entry)
            needed -= node.entry.rows
        return out

    def queued(self) -> int:
        return self._items

    def rank(self, entry: ItemT) -> tuple[int, int]:
        node = self._nodes[entry.key]
        return (node.count, node.stamp)

    def forget_counts(self) -> None:
        """Popularity has moved: every entry's count restarts at 1 (queue order kept) and the
        ghost's counts are dropped. O(entries)."""
        for node in self._nodes.values():
            node.count = 1
        self._ghost.clear()
        self._ghost_rows = 0
        self._regroup(restarted=True)

    def _regroup(self, *, restarted: bool) -> None:
        """The count queues after every count changed at once: restarted at 1, or halved. Both
        keep each count's order (merging queues 2k and 2k + 1 into k when halved)."""
        old = self._queues
        if restarted:
            self._queues = [deque() for _ in range(LFU_CAP + 1)]
            live = heapq.merge(*old, key=_stamp_of)
            self._queues[1].extend(item for item in live if item[1].stamp == item[0])
        else:
            self._queues = [
                deque(i for i in heapq.merge(*old[2 * k : 2 * k + 2], key=_stamp_of) if i[1].stamp == i[0])
                for k in range(LFU_CAP + 1)
            ]
        self._items = sum(len(q) for q in self._queues)

    def _next(self, protect: Container[str]) -> _Counted[ItemT] | None:
        evictable = self._evictable
        for queue in self._queues:
            if not queue:
                continue  # cheaper than an empty round
            for _ in range(len(queue)):
                stamp, node = queue.popleft()
                self._items -= 1
                if node.stamp != stamp:
                    continue  # stale
                entry = node.entry
                if evictable.get(entry.key) is entry and entry.key not in protect:
                    return node
                queue.append((stamp, node))  # held for now: it goes round
                self._items += 1
        return None

    def _push(self, node: _Counted[ItemT]) -> None:
        stamp = self._stamp = self._stamp + 1
        node.stamp = stamp
        self._queues[node.count].append((stamp, node))
        self._items += 1
        # stale items (a count moved on, a victim taken, an entry freed) are dropped when they
        # outnumber the entries: O(items) then, so O(1) amortised
        if self._items > 64 + 2 * len(self._nodes):
            for queue in self._queues:
                live = [(s, n) for s, n in queue if n.stamp == s]
                queue.clear()
                queue.extend(live)
            self._items = sum(len(q) for q in self._queues)

    def _accessed(self) -> None:
        self._accesses += 1
        tracked = len(self._nodes) + len(self._ghost)
        if self._accesses < self._age * (tracked if tracked > 64 else 64):  # not max(): a slow call
            return
        self._accesses = 0
        for key, (rows, count) in self._ghost.items():
            self._ghost[key] = (rows, count >> 1)
        for node in self._nodes.values():
            node.count >>= 1
        self._regroup(restarted=False)


def _stamp_of(item: tuple[int, object]) -> int:
    return item[0]


LEARNING_RATE = 0.45  # LeCaR's lambda: how much one regret moves the weights
MIN_WEIGHT = 0.001  # neither expert is ruled out, so its weight can come back when popularity moves
DISCOUNT = 0.005  # a regret's reward after as many accesses as entries held: later regrets weigh less
_LRU, _LFU = 0, 1


class LeCarPolicy(LfuPolicy[Entry]):
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
        discount: float = DISCOUNT,
    ) -> None:
        super().__init__(num_blocks, evictable, ghost_share=ghost_share, age=age)
        self._min_weight = min_weight
        self._discount = discount
        self._lru: OrderedDict[str, _Counted[Entry]] = OrderedDict()  # front: least recently used
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

    def _from_lru(self, protect: Container[str]) -> _Counted[Entry] | None:
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
        sooner (LeCaR's reward, discounted to `discount` after as many accesses as entries held). The
        penalty is divided by the expert's share of evictions (an importance weight, as in EXP3):
        an expert followed more often makes more regrets for that alone, and without it the
        weights drift to an even split whichever expert is better."""
        held = max(1, len(self._nodes))
        reward = self._discount ** (age / held)
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
