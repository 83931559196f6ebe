"""Eviction policies of the entry table: in which order evictable entries go.

The table decides which entries are evictable (READY, no pin, no grant, announcement ended, not
protected by the caller) and how many blocks it needs; a policy only orders them. Four ship:

- `fifo`: the queue of vLLM's EmbeddingCache. Entries go in reservation order, and an entry goes
  to the back when its last pin or grant is released (it was just read). A min-heap by the entry's
  queue number, with lazy deletion.
- `s3fifo`: S3-FIFO (Yang et al., SOSP '23) counted in blocks. A new entry joins a small queue
  (10% of the region); one that was read while there moves to the main queue when it reaches the
  small queue's end, one that was not is evicted and its key kept in a ghost list (keys only, 40%
  of the region's blocks). A reservation of a key still in the ghost list joins the main queue
  directly. The main queue is a FIFO with reinsertion: an entry read since it last passed the end
  goes round again (its read count, capped at 7, drops by one), one that was not is evicted. So an
  image seen once (a scan) costs at most the small queue, and the main queue keeps what is read
  again. The ghost and read-count sizes were chosen on the traces of `bench/eviction.py`
  (docs/eviction.md). A copy pulled from a peer that holds the item (a fleet pull, `copied`)
  waits in a third queue that gives up its entries before the other two are asked; the pulling
  request's load is not counted as a read, and a copy read here again joins the small queue as
  read once. So replicas that share a working set keep one copy of it (the encoder's, whose
  peer READs count as reads), and their regions together hold nearly what one region of the
  same bytes would (`bench/fleet_replay.py`, docs/fleet.md).
- `lecar` (ec_connector/domain/eviction_lecar.py): LRU and LFU as two experts weighted by how
  often their evictions were wanted again; fewer misses than `s3fifo` where popularity is stable
  or drifts, more on a trace of one-off bursts' neighbours (docs/eviction.md).
- `duel` (the default; ec_connector/domain/eviction_duel.py): LFU order or LRU order, whichever
  a shadow region replaying the other shows hitting more; the fewest misses of the four where
  popularity holds still, within a point of `fifo`'s where the ranking moves; pulled copies go
  first as under `s3fifo` (docs/eviction.md).

All are O(1) amortised per table operation (`fifo`: O(log entries) per victim) and never scan the
table: the queues are deques (or a heap) of entries with lazy deletion, compacted when stale items
outnumber live ones.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Container, Mapping
from typing import Protocol, runtime_checkable

from ec_connector.domain.entries import Entry
from ec_connector.domain.eviction_duel import DuelPolicy
from ec_connector.domain.eviction_lecar import LeCarPolicy

FIFO = "fifo"
S3FIFO = "s3fifo"
LECAR = "lecar"
DUEL = "duel"
POLICIES = (FIFO, S3FIFO, LECAR, DUEL)
"""Accepted values of `ec_eviction`."""

DEFAULT_POLICY = DUEL
"""The tier's default: within 1 point of `fifo`'s misses on every trace measured (+0.54 at most),
0.77-0.85x them on skewed popularity at regions of 10-25%, at 1.07-1.12x its step time
(docs/eviction.md)."""

SMALL_SHARE = 0.10  # S3-FIFO's small queue: the paper's 10%, counted in blocks
GHOST_SHARE = 0.40
"""Ghost keys: up to this share of the region's blocks. 0.25 was up to 2.0 points above fifo where
popularity shifts (engine-drift); 0.40 keeps every trace within 1 point of fifo for 0.2-0.8 points
more misses on stationary Zipf traces (docs/eviction.md)."""
MAX_READS = 7  # read count cap: how many extra rounds a much-read entry gets in the main queue


class EvictionPolicy(Protocol):
    """The order in which a table evicts. Calls come from the table, under the table's caller's
    lock; none of them blocks or reads a clock. `evictable` (given at construction) is the table's
    live map of evictable entries, read, never changed, by the policy."""

    name: str

    def reserved(self, entry: Entry) -> None:
        """A new entry (NOT_READY) was reserved."""

    def listed(self, entry: Entry) -> None:
        """`entry` became evictable (it is in `evictable` now)."""

    def read(self, entry: Entry) -> None:
        """`entry` was read: a load pinned it or a peer was granted a READ of it."""

    def freed(self, entry: Entry) -> None:
        """`entry` left the table (evicted, dropped, or its quarantine ended)."""

    def victims(self, needed: int, protect: Container[str]) -> list[Entry]:
        """Evictable entries outside `protect` that free at least `needed` blocks, in eviction
        order, taken out of the queue. The caller has checked that enough exist."""

    def queued(self) -> int:
        """Items in the queue(s), stale ones included: at most about twice the evictable entries."""

    def rank(self, entry: Entry) -> tuple[int, int]:
        """A sort key: evictable entries sorted by it are in eviction order (the table's slow path
        when a caller's time is behind the table's, which needs a one-off order of a subset)."""


@runtime_checkable
class CopyAwarePolicy(Protocol):
    """A policy that tells copies pulled from peers apart (`s3fifo`, `duel`); the table ignores the mark
    under a policy without it (`fifo`, vLLM's order, queues a copy as any entry)."""

    def copied(self, entry: Entry) -> None:
        """`entry`, reserved and not READY yet, is a copy of an item a live peer still holds (a
        fleet pull): the policy may let it go before the entries this replica encoded."""


def make_policy(
    name: str, *, num_blocks: int, evictable: Mapping[str, Entry], min_compact: int
) -> EvictionPolicy:
    """The policy called `name` (one of `POLICIES`) for a region of `num_blocks` blocks."""
    if name == FIFO:
        return FifoPolicy(evictable, min_compact=min_compact)
    if name == S3FIFO:
        return S3FifoPolicy(num_blocks, evictable, min_compact=min_compact)
    if name == LECAR:
        return LeCarPolicy(num_blocks, evictable)
    if name == DUEL:
        return DuelPolicy(num_blocks, evictable)
    raise ValueError(f"unknown eviction policy {name!r}: expected one of {', '.join(POLICIES)}")


class FifoPolicy:
    """Oldest queue number first. The table gives an entry its queue number (`Entry.order`) when
    it reserves it and again when its last pin or grant is released."""

    name = FIFO

    def __init__(self, evictable: Mapping[str, Entry], *, min_compact: int) -> None:
        self._evictable = evictable
        self._heap: list[tuple[int, str]] = []  # (order, key) of evictable entries, lazily deleted
        self._min_compact = min_compact
        self._compact_at = min_compact

    def reserved(self, entry: Entry) -> None:
        pass

    def read(self, entry: Entry) -> None:
        pass

    def freed(self, entry: Entry) -> None:
        pass

    def listed(self, entry: Entry) -> None:
        heap = self._heap
        heapq.heappush(heap, (entry.order, entry.key))
        if len(heap) > self._compact_at:
            heap[:] = [(e.order, k) for k, e in self._evictable.items()]
            heapq.heapify(heap)
            self._compact_at = max(self._min_compact, 2 * len(heap))

    def victims(self, needed: int, protect: Container[str]) -> list[Entry]:
        heap, evictable = self._heap, self._evictable
        victims: list[Entry] = []
        skipped = []
        while needed > 0:
            item = heapq.heappop(heap)
            candidate = evictable.get(item[1])
            if candidate is None or candidate.order != item[0] or candidate in victims:
                continue  # stale: no longer evictable (or listed twice)
            if item[1] in protect:
                skipped.append(item)
                continue
            victims.append(candidate)
            needed -= candidate.rows
        for item in skipped:
            heapq.heappush(heap, item)
        return victims

    def queued(self) -> int:
        return len(self._heap)

    def rank(self, entry: Entry) -> tuple[int, int]:
        return (0, entry.order)


_SMALL, _MAIN, _COPIES, _GONE = 0, 1, 2, 3


class _Node:
    """An entry's place in S3-FIFO: its queue, read count and the stamp of its live queue item."""

    __slots__ = ("entry", "queue", "reads", "stamp")

    def __init__(self, entry: Entry, queue: int) -> None:
        self.entry = entry
        self.queue = queue
        self.reads = 0
        self.stamp = 0  # 0: not queued yet (never READY)


class S3FifoPolicy:
    """S3-FIFO over blocks (see the module docstring). An entry joins its queue when it first
    becomes READY (bytes still arriving are never a victim, so they do not take a queue place).
    Pulled copies (`copied`) wait in a queue of their own, oldest first, which gives every victim
    it can before the small and main queues are asked."""

    name = S3FIFO

    def __init__(
        self,
        num_blocks: int,
        evictable: Mapping[str, Entry],
        *,
        min_compact: int,
        small_share: float = SMALL_SHARE,
        ghost_share: float = GHOST_SHARE,
        max_reads: int = MAX_READS,
    ) -> None:
        self._evictable = evictable
        self._small_target = max(1, int(num_blocks * small_share))
        self._ghost_limit = max(1, int(num_blocks * ghost_share))
        self._max_reads = max_reads
        self._nodes: dict[str, _Node] = {}
        self._queues: tuple[deque[tuple[int, _Node]], ...] = (deque(), deque(), deque())
        self._rows = [0, 0, 0]  # blocks of the queued entries of each queue (small, main, copies)
        self._live = [0, 0, 0]  # queued entries of each queue
        self._ghost: OrderedDict[str, int] = OrderedDict()  # key -> rows, oldest first
        self._ghost_rows = 0
        self._stamp = 0
        self._min_compact = min_compact

    def reserved(self, entry: Entry) -> None:
        rows = self._ghost.pop(entry.key, None)
        if rows is not None:
            self._ghost_rows -= rows
        self._nodes[entry.key] = _Node(entry, _SMALL if rows is None else _MAIN)

    def listed(self, entry: Entry) -> None:
        node = self._nodes[entry.key]
        if not node.stamp:
            self._rows[node.queue] += entry.rows
            self._live[node.queue] += 1
            self._append(node)

    def read(self, entry: Entry) -> None:
        node = self._nodes[entry.key]
        if node.queue == _COPIES:
            # The first read of a copy is the pulling request's load, which says nothing of reuse
            # here; a second makes it this replica's own: the small queue's back, read once.
            node.reads += 1
            if node.reads >= 2:
                node.reads = 1
                self._move(node, _SMALL)
            return
        if node.reads < self._max_reads:
            node.reads += 1

    def copied(self, entry: Entry) -> None:
        node = self._nodes[entry.key]
        if not node.stamp:  # not queued yet (the table marks copies before they are READY)
            node.queue = _COPIES

    def freed(self, entry: Entry) -> None:
        node = self._nodes.pop(entry.key)
        if node.stamp and node.queue != _GONE:
            self._rows[node.queue] -= entry.rows
            self._live[node.queue] -= 1
        node.queue = _GONE  # its queue item is stale now

    def victims(self, needed: int, protect: Container[str]) -> list[Entry]:
        victims: list[Entry] = []
        copies = self._live[_COPIES] > 0
        while needed > 0:
            victim = self._from_copies(protect) if copies else None
            if victim is None:
                copies = False  # none left, or all held: not asked again in this call
                if self._rows[_SMALL] >= self._small_target or not self._live[_MAIN]:
                    victim = self._small_victim(protect)
                if victim is None:
                    # the small queue's round can move read entries to the main queue without finding
                    # a victim among the rest: the main queue is asked again, holding them now
                    victim = self._from_main(protect) or self._from_small(protect) or self._from_main(protect)
            assert victim is not None, "victims() called with too few evictable blocks"
            victims.append(victim)
            needed -= victim.rows
        return victims

    def _small_victim(self, protect: Container[str]) -> Entry | None:
        """The victim taken from the small queue while it is over its share (a variant may filter)."""
        return self._from_small(protect)

    def queued(self) -> int:
        return sum(len(queue) for queue in self._queues)

    def rank(self, entry: Entry) -> tuple[int, int]:
        # copies first, then small-queue entries not read, then main-queue ones by reads left,
        # each in queue order
        node = self._nodes[entry.key]
        if node.queue == _COPIES:
            return (-1, node.stamp)
        if node.queue == _SMALL and not node.reads:
            return (0, node.stamp)
        return (1 + node.reads, node.stamp)

    # --- internals -----------------------------------------------------------------------------

    def _is_victim(self, node: _Node, protect: Container[str]) -> bool:
        entry = node.entry
        return self._evictable.get(entry.key) is entry and entry.key not in protect

    def _from_small(self, protect: Container[str]) -> Entry | None:
        """The small queue's first evictable entry not read; read ones move to the main queue on
        the way. None when a whole round finds none (all pinned, announced or protected)."""
        queue = self._queues[_SMALL]
        for _ in range(len(queue)):
            stamp, node = queue.popleft()
            if node.stamp != stamp or node.queue != _SMALL:
                continue  # stale
            rows = node.entry.rows
            if node.reads:
                node.reads = 0
                node.queue = _MAIN
                self._rows[_SMALL] -= rows
                self._live[_SMALL] -= 1
                self._rows[_MAIN] += rows
                self._live[_MAIN] += 1
                self._append(node)
            elif self._is_victim(node, protect):
                self._evict(node)
                self._remember(node.entry)
                return node.entry
            else:
                self._append(node)  # held for now: it goes round
        return None

    def _from_copies(self, protect: Container[str]) -> Entry | None:
        """The copies' queue's first evictable entry; held ones go round. None when a whole round
        finds none."""
        queue = self._queues[_COPIES]
        for _ in range(len(queue)):
            stamp, node = queue.popleft()
            if node.stamp != stamp or node.queue != _COPIES:
                continue  # stale
            if self._is_victim(node, protect):
                self._evict(node)
                return node.entry
            self._append(node)
        return None

    def _from_main(self, protect: Container[str]) -> Entry | None:
        """The main queue's first evictable entry with no reads left; each entry passed loses one
        read and goes round. None when no entry can go."""
        queue = self._queues[_MAIN]
        for _ in range((self._max_reads + 2) * len(queue)):
            if not queue:
                break
            stamp, node = queue.popleft()
            if node.stamp != stamp or node.queue != _MAIN:
                continue  # stale
            if node.reads:
                node.reads -= 1
                self._append(node)
            elif self._is_victim(node, protect):
                self._evict(node)
                return node.entry
            else:
                self._append(node)
        return None

    def _append(self, node: _Node) -> None:
        self._stamp += 1
        node.stamp = self._stamp
        queue = self._queues[node.queue]
        queue.append((self._stamp, node))
        if len(queue) > max(self._min_compact, 2 * self._live[node.queue]):
            live = [(s, n) for s, n in queue if n.stamp == s and n.queue == node.queue]
            queue.clear()
            queue.extend(live)

    def _move(self, node: _Node, queue: int) -> None:
        """Put `node` at the back of `queue` (its old queue item goes stale)."""
        if node.stamp:
            rows = node.entry.rows
            self._rows[node.queue] -= rows
            self._live[node.queue] -= 1
            self._rows[queue] += rows
            self._live[queue] += 1
            node.queue = queue
            self._append(node)
        else:
            node.queue = queue  # not queued yet: it joins `queue` when listed

    def _evict(self, node: _Node) -> None:
        self._rows[node.queue] -= node.entry.rows
        self._live[node.queue] -= 1
        node.queue = _GONE

    def _remember(self, entry: Entry) -> None:
        ghost = self._ghost
        ghost[entry.key] = entry.rows
        self._ghost_rows += entry.rows
        while self._ghost_rows > self._ghost_limit:
            _, rows = ghost.popitem(last=False)
            self._ghost_rows -= rows
