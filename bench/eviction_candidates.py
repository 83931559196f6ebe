"""Eviction policies measured beside the shipped ones in bench/eviction.py, and not shipped.

- `clock`: one FIFO queue with a read bit (CLOCK; SIEVE keeps the same bit but leaves a read entry
  in place instead of moving it to the back).
- `s3fifo-tinylfu`: S3-FIFO with a TinyLFU admission filter (a count-min sketch with aging)
  between its small and main queues.
- `FrequencySketch`: the count-min sketch of TinyLFU, also W-TinyLFU's (bench/eviction_wtinylfu.py).
- `policy_settings`: the keywords of a `policy:k=v,...` name, for every candidate that takes settings.
- `BlockGhost`: evicted keys' records within a budget of blocks, for the candidates that keep some.

(`lfu`, the LFU expert of the shipped `lecar`, is `ec_connector.domain.eviction_lecar.LfuPolicy`.)
Each follows `ec_connector.domain.eviction.EvictionPolicy`, so the bench swaps it into our
EntryTable and the table's guarantees (pins, leases, protection, run floor) hold as for the
shipped ones. docs/eviction.md gives their figures and why none ships.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Callable, Container, Mapping
from typing import Any

from ec_connector.domain.entries import Entry
from ec_connector.domain.eviction import (
    _MAIN,
    _SMALL,
    GHOST_SHARE,
    MAX_READS,
    SMALL_SHARE,
    S3FifoPolicy,
    _Node,
)

Settings = dict[str, tuple[str, Callable[[str], Any]]]  # short key -> (keyword, parse)


def flag(value: str) -> bool:
    """A `k=v` setting's truth: anything but 0, false or no."""
    return value not in ("0", "false", "no")


def policy_settings(name: str, keys: Settings) -> dict[str, Any]:
    """The keywords of a `policy:k=v,...` name (none without the colon), each value parsed by its
    key's parser; a clear error naming the name for an unknown key or a value that does not parse."""
    _, _, rest = name.partition(":")
    out: dict[str, Any] = {}
    for part in filter(None, rest.split(",")):
        key, eq, value = part.partition("=")
        if not eq or key not in keys:
            raise ValueError(f"{name!r}: expected k=v,... with k one of {sorted(keys)}")
        keyword, parse = keys[key]
        try:
            out[keyword] = parse(value)
        except ValueError:
            raise ValueError(f"{name!r}: {key}={value!r} is not a number") from None
    return out


class BlockGhost:
    """Records of evicted keys (what a policy restores when the key is reserved again), the oldest
    dropped first once their entries' blocks pass `limit`; a limit of 0 keeps none."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._records: OrderedDict[str, tuple[int, Any]] = OrderedDict()  # key -> rows, record
        self._rows = 0

    def add(self, key: str, rows: int, record: Any) -> None:
        if self._limit <= 0:
            return
        self._records[key] = (rows, record)
        self._rows += rows
        while self._rows > self._limit:
            _, (dropped, _record) = self._records.popitem(last=False)
            self._rows -= dropped

    def pop(self, key: str) -> Any | None:
        """`key`'s record, taken out of the ghost; None when it is not there."""
        found = self._records.pop(key, None)
        if found is None:
            return None
        self._rows -= found[0]
        return found[1]

    def remap(self, change: Callable[[Any], Any]) -> None:
        """Replace every record by `change` of it (in place, order kept)."""
        for key, (rows, record) in self._records.items():
            self._records[key] = (rows, change(record))


class ClockPolicy:
    """One FIFO queue with a read bit: an entry read since it last passed the end goes round once
    more (CLOCK)."""

    name = "clock"

    def __init__(self, evictable: Mapping[str, Entry]) -> None:
        self._evictable = evictable
        self._queue: dict[str, Entry] = {}  # insertion-ordered: the front is the oldest
        self._read: set[str] = set()

    def reserved(self, entry: Entry) -> None:
        pass

    def listed(self, entry: Entry) -> None:
        self._queue.setdefault(entry.key, entry)

    def read(self, entry: Entry) -> None:
        self._read.add(entry.key)

    def freed(self, entry: Entry) -> None:
        self._queue.pop(entry.key, None)
        self._read.discard(entry.key)

    def victims(self, needed: int, protect: Container[str]) -> list[Entry]:
        out: list[Entry] = []
        queue = self._queue
        while needed > 0:
            key, entry = next(iter(queue.items()))
            del queue[key]
            if key in self._read or self._evictable.get(key) is not entry or key in protect:
                self._read.discard(key)
                queue[key] = entry  # round again
                continue
            out.append(entry)
            needed -= entry.rows
        return out

    def queued(self) -> int:
        return len(self._queue)

    def rank(self, entry: Entry) -> tuple[int, int]:
        return (1 if entry.key in self._read else 0, entry.order)


_HALVE = bytes(i >> 1 for i in range(256))
_MIXERS = (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F)  # odd 32-bit multipliers, one a row
_MAX_COUNT = 15


class FrequencySketch:
    """How often each key was seen lately, approximately: a count-min sketch (4 rows of byte
    counters capped at 15, a key's estimate is its smallest counter; conservative update) whose
    counters are all halved after `10 x width` additions, so old popularity fades (TinyLFU's
    aging). The width grows (a power of two, at least twice the keys tracked) when `track` is told
    of more keys; growing starts the counts afresh. Stable across processes: keys hash by CRC-32."""

    __slots__ = ("_width", "_shift", "_counts", "_added", "_sample")

    def __init__(self, width: int = 64) -> None:
        self._resize(width)

    def _resize(self, width: int) -> None:
        width = 1 << max(6, (width - 1).bit_length())
        self._width = width
        self._shift = 32 - (width.bit_length() - 1)
        self._counts = bytearray(4 * width)
        self._added = 0
        self._sample = 10 * width

    @property
    def width(self) -> int:
        return self._width

    def track(self, keys: int) -> None:
        """At least `keys` keys are live: widen to twice that when narrower (O(width), rare)."""
        if 2 * keys > self._width:
            self._resize(4 * keys)

    def _slots(self, key: str) -> list[int]:
        h = zlib.crc32(key.encode())
        shift, width = self._shift, self._width
        return [row * width + (((h * m) & 0xFFFFFFFF) >> shift) for row, m in enumerate(_MIXERS)]

    def estimate(self, key: str) -> int:
        counts = self._counts
        return min(counts[i] for i in self._slots(key))

    def add(self, key: str) -> None:
        counts = self._counts
        slots = self._slots(key)
        least = min(counts[i] for i in slots)
        if least < _MAX_COUNT:
            for i in slots:
                if counts[i] == least:
                    counts[i] = least + 1
        self._added += 1
        if self._added >= self._sample:
            self._counts = counts.translate(_HALVE)
            self._added //= 2


class TinyLfuS3FifoPolicy(S3FifoPolicy):
    """S3-FIFO with a TinyLFU filter between its small and main queues. Every reservation and
    read of a key counts in a `FrequencySketch`. When the small queue is over its share, its
    first entry `c` meets the main queue's next victim `v` (the entry S3-FIFO would evict from
    the main queue): if `c` was read in the small queue (S3-FIFO's rule, when `read_admits`) or
    is seen more often than `v`, `c` moves to the main queue and `v` is evicted; otherwise `c`
    is evicted. So an image popular over a long span but not read again within the small
    queue's short stay still reaches the main queue, and a one-off image never displaces a
    popular one."""

    name = "s3fifo-tinylfu"

    def __init__(
        self,
        num_blocks: int,
        evictable: Mapping[str, Entry],
        *,
        min_compact: int,
        read_admits: bool = True,
        small_share: float = SMALL_SHARE,
        ghost_share: float = GHOST_SHARE,
        max_reads: int = MAX_READS,
    ) -> None:
        super().__init__(
            num_blocks,
            evictable,
            min_compact=min_compact,
            small_share=small_share,
            ghost_share=ghost_share,
            max_reads=max_reads,
        )
        self._read_admits = read_admits
        self.sketch = FrequencySketch()

    def reserved(self, entry: Entry) -> None:
        super().reserved(entry)
        self.sketch.track(len(self._nodes))
        self.sketch.add(entry.key)

    def read(self, entry: Entry) -> None:
        super().read(entry)
        self.sketch.add(entry.key)

    def _small_victim(self, protect: Container[str]) -> Entry | None:
        """The small queue's first entries meet the main queue's next victim until one of them
        loses and is evicted (returned). None when a whole round of the small queue finds none."""
        queue = self._queues[_SMALL]
        estimate = self.sketch.estimate
        for _ in range(len(queue)):
            stamp, node = queue.popleft()
            if node.stamp != stamp or node.queue != _SMALL:
                continue  # stale
            if node.reads and self._read_admits:
                self._promote(node)  # S3-FIFO's rule: read while in the small queue
                continue
            held = not self._is_victim(node, protect)
            if held and not node.reads:
                self._append(node)  # it goes round
                continue
            rival = self._main_front(protect)
            if rival is None:
                if node.reads:
                    self._promote(node)
                    continue
                self._evict(node)
                self._remember(node.entry)
                return node.entry
            if estimate(node.entry.key) > estimate(rival.entry.key):
                self._queues[_MAIN].popleft()  # the rival is at the main queue's front
                self._evict(rival)
                self._promote(node)
                return rival.entry
            if held:
                self._append(node)
                continue
            self._evict(node)
            self._remember(node.entry)
            return node.entry
        return None

    def _promote(self, node: _Node) -> None:
        rows = node.entry.rows
        node.reads = 0
        node.queue = _MAIN
        self._rows[_SMALL] -= rows
        self._live[_SMALL] -= 1
        self._rows[_MAIN] += rows
        self._live[_MAIN] += 1
        self._append(node)

    def _main_front(self, protect: Container[str]) -> _Node | None:
        """Walk the main queue as `_from_main` does (an entry read since it last passed the end
        spends a read and goes round, a held one goes round) up to its first victim, and leave
        that victim at the front. None when no entry can go."""
        queue = self._queues[_MAIN]
        for _ in range((self._max_reads + 2) * len(queue)):
            if not queue:
                break
            stamp, node = queue[0]
            if node.stamp != stamp or node.queue != _MAIN:
                queue.popleft()  # stale
                continue
            if not node.reads and self._is_victim(node, protect):
                return node
            queue.popleft()
            if node.reads:
                node.reads -= 1
            self._append(node)
        return None
