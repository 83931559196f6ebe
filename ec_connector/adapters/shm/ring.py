"""The completion table: one single-writer/single-reader ring of u64 slots per rank.

Rank r's worker is the only writer of ring r (its slots and its write count); the scheduler-side
process is the only reader (it publishes its read cursor). Counts only grow, so `count - cursor`
is the number of unread entries; a writer whose ring holds `slots` unread entries refuses the
post instead of overwriting or waiting.

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

from ec_connector.domain.errors import CompletionRingFull, RegionError
from ec_connector.domain.transfers import TICKET_LIMIT, Completion

from .header import READ_CURSOR_OFFSET, RING_HEAD, Geometry

_PRESENT = 1 << 63
_FAILED = 1 << 62


def encode(ticket: int, ok: bool) -> int:
    return _PRESENT | (0 if ok else _FAILED) | ticket


def decode(rank: int, word: int) -> Completion:
    if not word & _PRESENT:
        raise RegionError(f"completion ring of rank {rank} holds an empty slot below its write count")
    return Completion(rank, word & (TICKET_LIMIT - 1), ok=not word & _FAILED)


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

    def _slot_word(self, rank: int, n: int) -> int:
        return (self._geo.ring_offset(rank) + RING_HEAD) // 8 + n % self._geo.ring_slots

    def check(self, completion: Completion) -> None:
        rank, ticket = completion.rank, completion.ticket
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self._geo.ranks:
            raise ValueError(
                f"completion rank {rank!r} is outside 0..{self._geo.ranks - 1} (region {self._name} "
                f"has {self._geo.ranks} ranks)"
            )
        if isinstance(ticket, bool) or not isinstance(ticket, int) or not 0 < ticket < TICKET_LIMIT:
            raise ValueError(f"completion ticket {ticket!r} is outside 1..2**62-1")

    def post(self, completion: Completion) -> None:
        self.check(completion)
        rank, w = completion.rank, self._words
        with self._post_lock:
            count = w[self._count_word(rank)]
            unread = count - w[self._cursor_word(rank)]
            if unread >= self._geo.ring_slots:
                raise CompletionRingFull(
                    f"completion ring of rank {rank} in {self._name} is full ({unread} unread of "
                    f"{self._geo.ring_slots}): the scheduler side has stopped draining completions"
                )
            w[self._slot_word(rank, count)] = encode(completion.ticket, completion.ok)
            w[self._count_word(rank)] = count + 1  # after the slot: see the module docstring

    def drain(self) -> list[Completion]:
        out: list[Completion] = []
        w = self._words
        for rank in range(self._geo.ranks):
            cursor = w[self._cursor_word(rank)]
            count = w[self._count_word(rank)]
            if count == cursor:
                continue
            if not 0 < count - cursor <= self._geo.ring_slots:
                raise RegionError(
                    f"completion ring of rank {rank} in {self._name} is corrupt: write count {count}, "
                    f"read cursor {cursor}"
                )
            out.extend(decode(rank, w[self._slot_word(rank, n)]) for n in range(cursor, count))
            w[self._cursor_word(rank)] = count  # after reading the slots: frees them for the writer
        return out
