"""Orders per block in O(1) amortised: candidates of bench/eviction.py, not shipped (docs/eviction.md).

`duel-bucket:k=K` is `duel-block` (bench/eviction_block.py) with its heap replaced by FIFO queues
of a quantised count per block: an entry is queued at bucket floor(K * log2(count / rows)) (count
0 below all), victims are taken from the lowest non-empty bucket, oldest first. A bit mask of the
buckets that may hold items finds that bucket in O(1); the bucket of each (count, rows) is
tabled once per size. `lfu-bucket:k=K` is the same order without the duel. K (default 16) is the
buckets per octave: ratios within 2 ** (1 / K) of each other tie, and go oldest first; above 10,
distinct counts of one size never tie, so with one size the order is `lfu`'s exactly.

Measured (2-core machine, docs/eviction.md "Ordering per block, measured online"): K=16 meets
duel-block's sweep cells (24 of 33, drift 0.77x) and costs as much as its heap in
bench/eviction_step_cost.py (1.20-1.27x fifo's step p50, duel 1.07-1.12x): the time inside the
policy is within ~10% of duel's; the rest is the table serving the per-block order's decisions
(more misses, more runs freed), which no cheaper order removes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Container, Mapping
from functools import cache
from typing import Any, ClassVar

from bench.eviction_candidates import Settings, policy_settings
from ec_connector.domain.entries import Entry
from ec_connector.domain.eviction_duel import DuelPolicy, LfuShadow, ShadowKey
from ec_connector.domain.eviction_lecar import LFU_CAP, ItemT, LfuPolicy, _Counted

MAX_LOG_ROWS = 20  # sizes up to 2 ** 20 blocks get buckets of their own; larger ones share the lowest
K = 16  # buckets per octave of count / rows: above 10, distinct counts of one size never tie


def _buckets(k: int) -> int:
    return k * (MAX_LOG_ROWS + 4) + 2  # count 0; then log2(1 / 2 ** 20) .. log2(15) < 4


def _table(k: int, rows: int) -> tuple[int, ...]:
    """The bucket of each count 0..LFU_CAP for an entry of `rows` blocks."""
    out = [0]
    for count in range(1, LFU_CAP + 1):
        b = math.floor(k * math.log2(count / rows)) + k * MAX_LOG_ROWS + 1
        out.append(min(_buckets(k) - 1, max(1, b)))
    return tuple(out)


class _Tables(dict[int, tuple[int, ...]]):
    """rows -> the bucket of each count, filled on first sight of a size."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k

    def __missing__(self, rows: int) -> tuple[int, ...]:
        table = self[rows] = _table(self.k, rows)
        return table


class BucketOrder(LfuPolicy[ItemT]):
    """`LfuPolicy`'s counts, ghost and aging, its victims by quantised count per block."""

    k: ClassVar[int] = K

    def __init__(self, num_blocks: int, evictable: Mapping[str, ItemT], **kw: Any) -> None:
        super().__init__(num_blocks, evictable, **kw)
        self._queues = [deque() for _ in range(_buckets(self.k))]
        self._mask = 0  # bit b: bucket b may hold items (stale ones included)
        self._tables = _Tables(self.k)  # rows -> the bucket of each count

    def _push(self, node: _Counted[ItemT]) -> None:
        self._stamp += 1
        node.stamp = self._stamp
        b = self._tables[node.entry.rows][node.count]
        self._queues[b].append((self._stamp, node))
        self._mask |= 1 << b
        self._items += 1
        if self._items > 64 + 2 * len(self._nodes):  # stale items outnumber the entries: drop them
            mask = 0
            for b, queue in enumerate(self._queues):
                if queue:
                    live = [(s, n) for s, n in queue if n.stamp == s]
                    queue.clear()
                    queue.extend(live)
                    if live:
                        mask |= 1 << b
            self._mask = mask
            self._items = sum(len(q) for q in self._queues)

    def _next(self, protect: Container[str]) -> _Counted[ItemT] | None:
        evictable, queues = self._evictable, self._queues
        rest = self._mask
        while rest:
            low = rest & -rest
            rest ^= low
            queue = queues[low.bit_length() - 1]
            for _ in range(len(queue)):
                stamp, node = queue.popleft()
                self._items -= 1
                if node.stamp != stamp:
                    continue  # stale
                entry = node.entry
                if evictable.get(entry.key) is entry and entry.key not in protect:
                    if not queue:
                        self._mask ^= low
                    return node
                queue.append((stamp, node))  # held for now: it goes round
                self._items += 1
            if not queue:
                self._mask ^= low
        return None

    def _regroup(self, *, restarted: bool) -> None:
        # every count changed at once (restarted at 1, or halved): re-bucket the live items, oldest first
        live = sorted(
            (item for queue in self._queues for item in queue if item[1].stamp == item[0]), key=_first
        )
        queues = self._queues = [deque() for _ in range(len(self._queues))]
        mask, tables = 0, self._tables
        for item in live:
            b = tables[item[1].entry.rows][item[1].count]
            queues[b].append(item)
            mask |= 1 << b
        self._mask = mask
        self._items = len(live)


def _first(item: tuple[int, object]) -> int:
    return item[0]


@cache
def bucket_classes(k: int = K) -> tuple[type[BucketOrder[Entry]], type[BucketOrder[Entry]]]:
    """(`lfu-bucket:k=K`, `duel-bucket:k=K`): the classes, made once per K."""

    class Keys(BucketOrder[ShadowKey]):
        name = "lfu-bucket"

    Keys.k = k

    class Shadow(LfuShadow):
        order = Keys

    class Lfu(BucketOrder[Entry]):
        name = "lfu-bucket"

    Lfu.k = k

    class Duel(BucketOrder[Entry], DuelPolicy):
        name = "duel-bucket"
        lfu_shadow = Shadow

    Duel.k = k
    return Lfu, Duel


BUCKET_SETTINGS: Settings = {"k": ("k", int)}


def is_bucket(policy: str) -> bool:
    return policy.partition(":")[0] in ("lfu-bucket", "duel-bucket")


def make_bucket(policy: str, num_blocks: int, evictable: Mapping[str, Entry]) -> BucketOrder[Entry]:
    """The policy `lfu-bucket[:k=K]` or `duel-bucket[:k=K]` stands for."""
    lfu, duel = bucket_classes(**policy_settings(policy, BUCKET_SETTINGS))
    return (duel if policy.startswith("duel") else lfu)(num_blocks, evictable)
