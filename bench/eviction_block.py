"""Orders per block: candidates of bench/eviction.py, not shipped (docs/eviction.md).

`lfu-block` is `LfuPolicy` with its victims ranked by count per block (count / rows, then oldest
first) instead of by count: a small image requested as often as a large one stays longer, so more
requests hit in the same bytes, and fewer of the bytes requested. `duel-block` is `duel` with
that order on its LFU side (its region's and its LFU shadow's); its LRU side is unchanged. With
one size of item both are `lfu` and `duel` exactly.

They measure what an order per block gives on the item target (miss ratio) against what it
costs in byte misses (encoder time). The order is a heap with lazy deletion (O(log entries) an
operation), not the shipped count queues: enough for a replay, not for the step thread.
"""

from __future__ import annotations

import heapq
from collections.abc import Container, Mapping
from typing import Any

from ec_connector.domain.entries import Entry
from ec_connector.domain.eviction_duel import DuelPolicy, LfuShadow, ShadowKey
from ec_connector.domain.eviction_lecar import ItemT, LfuPolicy, _Counted


class BlockOrder(LfuPolicy[ItemT]):
    """`LfuPolicy`'s counts, ghost and aging, its victims by count per block."""

    def __init__(self, num_blocks: int, evictable: Mapping[str, ItemT], **kw: Any) -> None:
        self._heap: list[tuple[float, int, _Counted[ItemT]]] = []  # (count / rows, stamp, node)
        super().__init__(num_blocks, evictable, **kw)

    def _push(self, node: _Counted[ItemT]) -> None:
        self._stamp += 1
        node.stamp = self._stamp
        heapq.heappush(self._heap, (node.count / node.entry.rows, self._stamp, node))
        self._items += 1
        if self._items > 64 + 2 * len(self._nodes):  # stale items outnumber the entries
            self._regroup(restarted=False)

    def _next(self, protect: Container[str]) -> _Counted[ItemT] | None:
        heap, evictable = self._heap, self._evictable
        held: list[tuple[float, int, _Counted[ItemT]]] = []
        found = None
        while heap:
            item = heapq.heappop(heap)
            self._items -= 1
            node = item[2]
            if node.stamp != item[1]:
                continue  # stale
            entry = node.entry
            if evictable.get(entry.key) is entry and entry.key not in protect:
                found = node
                break
            held.append(item)  # held for now: back in the heap once a victim is found
        for item in held:
            heapq.heappush(heap, item)
        self._items += len(held)
        return found

    def _regroup(self, *, restarted: bool) -> None:
        # counts changed (or stale items piled up): re-rank the live items, stamps kept
        live = [(n.count / n.entry.rows, s, n) for _, s, n in self._heap if n.stamp == s]
        heapq.heapify(live)
        self._heap = live
        self._items = len(live)


class BlockLfuPolicy(BlockOrder[Entry]):
    name = "lfu-block"


class _BlockKeys(BlockOrder[ShadowKey]):
    name = "lfu-block"


class BlockLfuShadow(LfuShadow):
    order = _BlockKeys


class BlockDuelPolicy(BlockOrder[Entry], DuelPolicy):
    name = "duel-block"
    lfu_shadow = BlockLfuShadow
