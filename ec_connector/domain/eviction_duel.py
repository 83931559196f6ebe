"""The `duel` eviction policy (`ec_eviction = "duel"`): the region is evicted in least frequently
used order or in least recently used order, whichever a shadow region of the other order shows
hitting more.

Keeping the most requested images is the best an online policy can do while popularity holds
still; when the ranking moves, counts keep the stale favourites and recency does better. The
policy follows one order and replays the other on a **shadow region**: the same blocks, keys only,
fed every request the region sees (a reservation is a miss, a read a hit), without pins or saves.
A request that one side hits and the other misses counts for that side. Once per `entries held`
requests (a period), when the shadow's lead (its hits the region missed, less the reverse) is
above `z` times the square root of the requests where the two differed, the policy turns to the
shadow's order and a new shadow, filled with the region's entries, replays the order just left
(a shadow that started empty would lose its first fill's misses to the full region); otherwise
both counts are multiplied by `2 ** (-1 / window)`, so the lead is recent evidence. This is set
dueling (Qureshi et al., ISCA '07) with a whole shadow in place of sampled sets.

- LFU order is `LfuPolicy` (counts capped at 15, kept for evicted keys in a ghost of 4x the
  region's blocks, halved every 10x the tracked keys' accesses); it is kept for every entry while
  the policy follows LRU, so turning back finds current counts. Turning to LRU is the sign that
  popularity moved, so every count restarts at 1 then (the region's, the ghost's dropped, and the
  new LFU shadow's): counts from before would keep LFU behind for as long as they last.
- LRU order: an OrderedDict of the evictable entries, built when the policy turns to it from the
  table's queue numbers (an entry's `order` is renewed when its last pin or grant is released:
  it was just read), kept while the policy follows LRU, dropped when it turns back.

**Copies pulled from peers** (fleet sharing, `copied`) wait in a queue of their own, oldest
first, which gives every victim it can before either order is asked, as under `s3fifo`: the
pulling request's load is not counted, and a copy read here again leaves that queue as this
replica's own entry, counted from then on. Pulls are not scored in the duel: the region lets
copies go first and the shadow would not, so it would win every later ask of a pulled item and
turn the region for it. So a reservation is scored (a miss) when it becomes READY, not when made:
by then the table has said whether it is a copy.

**A burst of new images** (a scan: a batch of one-off uploads) must not flush the images read
again later: a run of `burst_run` or more reservations of keys the policy has never seen (not in
the ghost of counts), with no other reservation or read between, marks its entries, and marked
entries not read since go next after the copies, oldest first, before either order is asked. A
read clears the mark. In steady traffic a hit or a returning key breaks every run long before it
is a burst.

Every operation is O(1) amortised (the shadow is an OrderedDict, or `LfuPolicy` over keys) but a
turn, which sorts the entries by last use: O(entries log entries) at most once a period, so
O(log entries) a request if it turned every period.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Container, Iterable, Mapping
from typing import Any

from ec_connector.domain.entries import Entry
from ec_connector.domain.eviction_lecar import LfuPolicy, _Counted

WINDOW = 4.0  # periods: the duel's counts halve over this many
BURST_RUN = 16  # reservations of never-seen keys in a row, nothing else between, that are a burst
Z = 1.0  # the shadow's lead must pass this many times its noise (the root of the disagreements)


class ShadowKey:
    """A key held by a shadow region, with its size in blocks."""

    __slots__ = ("key", "rows")

    def __init__(self, key: str, rows: int) -> None:
        self.key = key
        self.rows = rows


class LruShadow:
    """A region of `capacity` blocks in least recently used order, keys only; `held` (key, rows,
    least recent first) fills it at the start."""

    def __init__(self, capacity: int, held: Iterable[tuple[str, int]] = ()) -> None:
        self.capacity = capacity
        self._resident: OrderedDict[str, int] = OrderedDict(held)  # key -> rows, least recent first
        self.used = sum(self._resident.values())

    def request(self, key: str, rows: int) -> bool:
        """One request of `key`: True on a hit; a miss admits it, evicting the least recent."""
        resident = self._resident
        if key in resident:
            resident.move_to_end(key)
            return True
        capacity = self.capacity
        if rows > capacity:
            return False
        used = self.used + rows
        while used > capacity:
            used -= resident.popitem(False)[1]  # the least recent key's rows
        resident[key] = rows
        self.used = used
        return False


class LfuShadow:
    """A region of `capacity` blocks in `LfuPolicy`'s order (`order`: that class or a subclass),
    keys only; `held` (key, rows, least recent first) fills it at the start, each counted once."""

    order: type[LfuPolicy[ShadowKey]] = LfuPolicy

    def __init__(self, capacity: int, held: Iterable[tuple[str, int]] = ()) -> None:
        self.capacity = capacity
        self.used = 0
        self._resident: dict[str, ShadowKey] = {}
        self._order: LfuPolicy[ShadowKey] = self.order(capacity, self._resident)
        for key, rows in held:
            item = ShadowKey(key, rows)
            self._resident[key] = item
            self.used += rows
            self._order.reserved(item)
            self._order.listed(item)

    def request(self, key: str, rows: int) -> bool:
        """One request of `key`: True on a hit; a miss admits it, evicting the least frequent."""
        resident, order = self._resident, self._order
        found = resident.get(key)
        if found is not None:
            order.read(found)
            return True
        if rows > self.capacity:
            return False
        if self.used + rows > self.capacity:
            for victim in order.victims(self.used + rows - self.capacity, ()):
                del resident[victim.key]
                self.used -= victim.rows
                order.freed(victim)
        item = ShadowKey(key, rows)
        resident[key] = item
        self.used += rows
        order.reserved(item)
        order.listed(item)
        return False


class DuelPolicy(LfuPolicy[Entry]):
    """LFU or LRU order, chosen by a shadow region of the other (module docstring)."""

    name = "duel"
    lfu_shadow: type[LfuShadow] = LfuShadow  # the shadow while the region follows LRU

    def __init__(
        self,
        num_blocks: int,
        evictable: Mapping[str, Entry],
        *,
        window: float = WINDOW,
        z: float = Z,
        burst_run: int = BURST_RUN,
    ) -> None:
        super().__init__(num_blocks, evictable)
        self._blocks = num_blocks
        self._lru: OrderedDict[str, _Counted[Entry]] | None = None  # while following LRU: least recent first
        self._copies: OrderedDict[str, int] = OrderedDict()  # pulled copies -> reads seen, oldest first
        self._burst: OrderedDict[str, _Counted[Entry]] = OrderedDict()  # marked, not read since; oldest first
        self._burst_run = burst_run
        # the last new keys reserved, as many as a run has before it is a burst
        self._recent_new: deque[_Counted[Entry]] = deque(maxlen=max(0, burst_run - 1))
        self._run_length = 0  # new keys reserved in a row, nothing else between
        self._last_new = -1  # the LFU order's access count just after the last new key's reservation
        self._shadow: LruShadow | LfuShadow = LruShadow(num_blocks)
        self._ask = self._shadow.request
        self._lead = 0.0  # decayed: the shadow's hits the region missed, less the reverse
        self._differed = 0.0  # decayed: requests where the two differed
        self._countdown = 1  # requests left in this period
        self._keep = 2.0 ** (-1.0 / window)
        self._z = z

    @property
    def follows_lru(self) -> bool:
        """Whether the region is evicted in LRU order now (LFU order otherwise)."""
        return self._lru is not None

    def reserved(self, entry: Entry) -> None:
        node = self._count_in(entry)
        if node is None:
            return  # a key the ghost knew (not new): not part of a burst
        # every reservation and read moves the access count by one, so a run is unbroken when
        # nothing was counted between this new key and the last
        accesses = self._accesses
        length = self._run_length + 1 if accesses - 1 == self._last_new else 1
        self._run_length, self._last_new = length, accesses
        if length < self._burst_run:
            self._recent_new.append(node)
            return
        if length == self._burst_run:  # a burst now: the run's earlier keys are the last new ones
            for earlier in self._recent_new:
                if self._nodes.get(earlier.entry.key) is earlier:
                    self._burst[earlier.entry.key] = earlier
        self._burst[entry.key] = node

    def read(self, entry: Entry) -> None:
        copy_reads = self._copies.get(entry.key) if self._copies else None
        if copy_reads == 0:  # the pulling request's load says nothing of reuse here
            self._copies[entry.key] = 1
            return
        if self._burst:
            self._burst.pop(entry.key, None)
        LfuPolicy.read(self, entry)
        if copy_reads is not None:
            # read here again: this replica's own from now on. The shadow learns the key (it
            # would have pulled it too) and neither side scores: the pull served the first ask
            del self._copies[entry.key]
            self._push(self._nodes[entry.key])  # queued as any own entry, read while held
            self._ask(entry.key, entry.rows)
            return
        if self._lru is not None and entry.key in self._lru:
            self._lru.move_to_end(entry.key)
        self._duel(entry, hit=True)

    def copied(self, entry: Entry) -> None:
        if self._nodes[entry.key].stamp == 0:  # not queued yet (the table marks copies before READY)
            self._copies[entry.key] = 0

    def listed(self, entry: Entry) -> None:
        key = entry.key
        if key in self._copies:
            return  # it keeps its place among the copies; a pull is not this replica's miss
        node = self._nodes[key]
        if node.stamp == 0:  # a reservation's first listing: its miss is scored now
            self._duel(entry, hit=False)
        if node.stamp <= 0:  # queued as `LfuPolicy.listed` does, without its frame (every unpin)
            self._push(node)
        if self._lru is not None:
            self._lru.setdefault(key, node)

    def freed(self, entry: Entry) -> None:
        if self._copies:
            self._copies.pop(entry.key, None)
        if self._burst:
            self._burst.pop(entry.key, None)
        LfuPolicy.freed(self, entry)
        if self._lru is not None:
            self._lru.pop(entry.key, None)

    def victims(self, needed: int, protect: Container[str]) -> list[Entry]:
        if self._lru is None and not self._copies and not self._burst:
            return LfuPolicy.victims(self, needed, protect)
        out: list[Entry] = []
        lru = self._lru
        for first in (self._copies, self._burst):
            while needed > 0 and first:
                key = self._take_oldest(first, protect)
                if key is None:
                    break  # every one is held
                node = self._nodes[key]
                node.stamp = 0  # its LFU queue item, if any, is stale now
                if lru is not None:
                    lru.pop(key, None)
                out.append(node.entry)
                needed -= node.entry.rows
        if needed <= 0:
            return out
        if lru is None:
            return out + LfuPolicy.victims(self, needed, protect)
        evictable = self._evictable
        while needed > 0:
            for _ in range(len(lru)):
                key, node = next(iter(lru.items()))
                if evictable.get(key) is node.entry and key not in protect:
                    break
                lru.move_to_end(key)  # held for now: it goes round
            else:
                raise AssertionError("victims() called with too few evictable blocks")
            del lru[key]
            node.stamp = 0  # its LFU queue item is stale now
            out.append(node.entry)
            needed -= node.entry.rows
        return out

    def queued(self) -> int:
        lru = len(self._lru) if self._lru is not None else 0
        return LfuPolicy.queued(self) + len(self._copies) + len(self._burst) + lru

    def rank(self, entry: Entry) -> tuple[int, int]:
        if entry.key in self._copies:
            return (-2, entry.order)  # copies first, oldest first
        if entry.key in self._burst:
            return (-1, entry.order)  # then a burst's entries not read since
        if self._lru is not None:
            return (0, entry.order)  # the table's queue number is recency
        return LfuPolicy.rank(self, entry)

    # --- internals -----------------------------------------------------------------------------

    def _take_oldest(self, queue: OrderedDict[str, Any], protect: Container[str]) -> str | None:
        """The oldest evictable key of `queue` (the copies' or the burst's), taken out of it; held
        ones go round. None when a whole round finds none."""
        evictable = self._evictable
        for _ in range(len(queue)):
            key = next(iter(queue))
            entry = evictable.get(key)
            if entry is not None and entry is self._nodes[key].entry and key not in protect:
                del queue[key]
                return key
            queue.move_to_end(key)
        return None

    def _duel(self, entry: Entry, *, hit: bool) -> None:
        """One request scored: the region `hit` or not, the shadow asked; a period's end may turn."""
        if self._ask(entry.key, entry.rows) is not hit:
            self._lead += -1.0 if hit else 1.0
            self._differed += 1.0
        self._countdown -= 1
        if self._countdown > 0:
            return
        self._countdown = len(self._nodes)
        if self._lead > self._z * math.sqrt(self._differed):
            self._turn()
        else:
            self._lead *= self._keep
            self._differed *= self._keep

    def _turn(self) -> None:
        """Follow the shadow's order; a new shadow, filled with the region's entries, replays the
        order left. Turning to LRU says popularity moved: the counts restart (the region's and the
        new LFU shadow's), or the stale favourites would keep LFU behind for as long as they last."""
        held = sorted(self._nodes.values(), key=_order_of)  # least recent first
        if self._lru is None:
            self._lru = OrderedDict((node.entry.key, node) for node in held if node.stamp > 0)
            self.forget_counts()
        else:
            self._lru = None
        keys = ((node.entry.key, node.entry.rows) for node in held)
        self._shadow = (
            self.lfu_shadow(self._blocks, keys) if self._lru is not None else LruShadow(self._blocks, keys)
        )
        self._ask = self._shadow.request
        self._lead = self._differed = 0.0


def _order_of(node: _Counted[Entry]) -> int:
    return node.entry.order
