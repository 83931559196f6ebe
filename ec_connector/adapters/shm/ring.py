"""The completion table: one single-writer/single-reader ring of u64 slots per rank.

Rank r's worker is the only writer of ring r (its slots and its write count); the scheduler-side
process is the only reader (it publishes its read cursor). Counts only grow, so `count - cursor`
is the number of unread entries. A post of several tickets writes the slots of those that fit and
then the count once; it never overwrites an unread slot or waits: the writer posts the rest later.

Ordering. Each u64 is one aligned 8-byte store/load through `memoryview.cast("Q")`, so it is
never torn. The writer stores the slot, then the count; the reader loads the count, then the
slots, then stores its cursor. This relies on the x86-64 (TSO) memory model: stores become
visible in program order and loads are not reordered with older loads or later stores. On a
weakly ordered CPU (aarch64) the same code would need fences between the two stores.

Encoding of one entry: bit 63 set (an entry, never an empty slot), bit 62 set when the copy
failed, bits 0..61 the ticket (< 2**62).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ec_connector.domain.errors import RegionError
from ec_connector.domain.transfers import TICKET_LIMIT, Completion, check_completions

from .header import READ_CURSOR_OFFSET, RING_HEAD, Geometry

_PRESENT = 1 << 63
_FAILED = 1 << 62
_TICKET = TICKET_LIMIT - 1


class CompletionRings:
    """The rings of one mapping, over `words`: the whole file viewed as u64s."""

    def __init__(self, words: memoryview, geometry: Geometry, *, name: str) -> None:
        self._words = words
        self._geo = geometry
        self._name = name
        self._post_lock = threading.Lock()  # threads of one process posting for the same rank

    def _count_word(self, rank: int) -> int:
        return self._geo.ring_offset(rank) // 8

    def _cursor_word(self, rank: int) -> int:
        return (self._geo.ring_offset(rank) + READ_CURSOR_OFFSET) // 8

    def _head_word(self, rank: int) -> int:
        """The word of rank `rank`'s slot 0 (entry n lies at slot n % ring_slots)."""
        return (self._geo.ring_offset(rank) + RING_HEAD) // 8

    def post(self, rank: int, tickets: Sequence[int], ok: bool) -> int:
        """Append `tickets` to rank `rank`'s ring, in order; how many fitted (the first ones)."""
        check_completions(rank, tickets, ranks=self._geo.ranks, region=self._name)
        w, slots = self._words, self._geo.ring_slots
        head = self._head_word(rank)
        count_word, cursor_word = self._count_word(rank), self._cursor_word(rank)
        flag = _PRESENT if ok else _PRESENT | _FAILED
        with self._post_lock:
            count = w[count_word]
            n = min(len(tickets), slots - (count - w[cursor_word]))
            if n <= 0:
                return 0
            for i in range(n):
                w[head + (count + i) % slots] = flag | tickets[i]
            w[count_word] = count + n  # after the slots: see the module docstring
        return n

    def drain(self) -> list[Completion]:
        out: list[Completion] = []
        w, slots = self._words, self._geo.ring_slots
        for rank in range(self._geo.ranks):
            cursor = w[self._cursor_word(rank)]
            count = w[self._count_word(rank)]
            if count == cursor:
                continue
            if not 0 < count - cursor <= slots:
                raise RegionError(
                    f"completion ring of rank {rank} in {self._name} is corrupt: write count {count}, "
                    f"read cursor {cursor}"
                )
            head = self._head_word(rank)
            first, last = cursor % slots, count % slots
            if first < last:
                words = w[head + first : head + last].tolist()
            else:  # the unread slots wrap around the end of the ring
                words = w[head + first : head + slots].tolist() + w[head : head + last].tolist()
            for word in words:
                if not word & _PRESENT:
                    raise RegionError(
                        f"completion ring of rank {rank} holds an empty slot below its write count"
                    )
                out.append(Completion(rank, word & _TICKET, not word & _FAILED))
            w[self._cursor_word(rank)] = count  # after reading the slots: frees them for the writer
        return out
