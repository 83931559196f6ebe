"""The entry table: entries by identifier over one extent allocator.

Rules held here:
- an entry is keyed by its item identifier and owns its extents until it is freed;
- space is made by evicting READY, unpinned, unannounced entries oldest-first (FIFO by reservation);
- an allocation that cannot fit even after evicting every evictable entry fails at once and evicts
  nothing;
- deadlines (save lease, producer grant lease, announcement, quarantine) are settled by `expire`,
  which the caller runs with the current time; the table never reads a clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Container
from dataclasses import dataclass, field
from enum import Enum

from ec_connector.domain.blocks import ExtentAllocator
from ec_connector.domain.entries import Entry, Phase
from ec_connector.domain.errors import IllegalTransition, UnknownEntry


class _Deadline(Enum):
    SAVE = 0
    GRANT = 1
    ANNOUNCE = 2
    QUARANTINE = 3


@dataclass(frozen=True, slots=True)
class Reservation:
    """A new NOT_READY entry, and the entries evicted to make room for it."""

    entry: Entry
    evicted: tuple[Entry, ...]


@dataclass(slots=True)
class Expiry:
    """What `expire` settled: keys of entries whose deadline passed."""

    save_lapsed: list[str] = field(default_factory=list)
    grants_released: list[tuple[str, int]] = field(default_factory=list)
    announcements_ended: list[str] = field(default_factory=list)
    quarantines_settled: list[Entry] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.save_lapsed or self.grants_released or self.announcements_ended or self.quarantines_settled
        )


class EntryTable:
    """Entries of one region, keyed by identifier, in reservation (FIFO) order."""

    def __init__(self, num_blocks: int) -> None:
        self.blocks = ExtentAllocator(num_blocks)
        self._entries: dict[str, Entry] = {}
        self._deadlines: list[tuple[float, int, str, _Deadline, int]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: str) -> Entry | None:
        return self._entries.get(key)

    def entries(self) -> tuple[Entry, ...]:
        """All entries, oldest reservation first."""
        return tuple(self._entries.values())

    def is_ready(self, key: str) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.is_ready

    def evictable_blocks(self, now: float, protect: Container[str] = ()) -> int:
        return sum(e.rows for e in self._entries.values() if e.is_evictable(now) and e.key not in protect)

    def can_fit(self, rows: int, now: float, protect: Container[str] = ()) -> bool:
        """True when `rows` blocks fit now, counting what eviction could free."""
        free = self.blocks.free_blocks
        return rows <= free or rows <= free + self.evictable_blocks(now, protect)

    def reserve(
        self,
        key: str,
        rows: int,
        *,
        now: float,
        lease_s: float,
        protect: Container[str] = (),
    ) -> Reservation | None:
        """Add a NOT_READY entry of `rows` blocks, evicting FIFO if needed; None if it cannot fit.

        Entries whose keys are in `protect` are not evicted (e.g. items promised to vLLM this
        step). On None nothing was evicted. Raises IllegalTransition if `key` is already held.
        """
        if key in self._entries:
            raise IllegalTransition(f"entry {key!r} is already held")
        if rows <= 0:
            raise ValueError(f"entry {key!r}: cannot reserve {rows} rows")
        if rows > self.blocks.num_blocks or not self.can_fit(rows, now, protect):
            return None
        evicted: list[Entry] = []
        if rows > self.blocks.free_blocks:
            for victim in list(self._entries.values()):
                if victim.is_evictable(now) and victim.key not in protect:
                    evicted.append(victim)
                    self._free(victim)
                    if rows <= self.blocks.free_blocks:
                        break
        extents = self.blocks.allocate(rows)
        assert extents is not None  # guaranteed by can_fit and the evictions above
        entry = Entry(key=key, extents=extents, rows=rows, ready_deadline=now + lease_s)
        self._entries[key] = entry
        self._push(entry.ready_deadline, key, _Deadline.SAVE)
        return Reservation(entry, tuple(evicted))

    def mark_ready(self, key: str) -> Entry:
        entry = self._require(key)
        entry.mark_ready()
        return entry

    def extend_ready_deadline(self, key: str, deadline: float) -> None:
        self._require(key).extend_ready_deadline(deadline)
        self._push(deadline, key, _Deadline.SAVE)

    def pin(self, key: str) -> Entry:
        entry = self._require(key)
        entry.pin()
        return entry

    def unpin(self, key: str) -> Entry:
        entry = self._require(key)
        entry.unpin()
        return entry

    def grant(self, key: str, grant_id: int, *, now: float, lease_s: float) -> Entry:
        entry = self._require(key)
        entry.grant(grant_id, now + lease_s)
        self._push(now + lease_s, key, _Deadline.GRANT, grant_id)
        return entry

    def release_grant(self, key: str, grant_id: int) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.release_grant(grant_id)

    def announce(self, key: str, *, now: float, lease_s: float) -> Entry:
        entry = self._require(key)
        entry.announce(now + lease_s)
        self._push(now + lease_s, key, _Deadline.ANNOUNCE)
        return entry

    def quarantine(self, key: str, *, now: float, quarantine_s: float) -> Entry:
        """Hold a NOT_READY entry's blocks unusable until `now + quarantine_s`."""
        entry = self._require(key)
        entry.quarantine(now + quarantine_s)
        self._push(entry.quarantined_until, key, _Deadline.QUARANTINE)
        return entry

    def drop(self, key: str) -> Entry:
        """Free an unpinned entry that no copy or DMA can still write (e.g. a NACKed reservation)."""
        entry = self._require(key)
        if entry.is_pinned:
            raise IllegalTransition(f"entry {key!r} is pinned ({entry.pin_count}); cannot drop")
        if entry.phase is Phase.QUARANTINED:
            raise IllegalTransition(f"entry {key!r} is quarantined; it is freed when that ends")
        self._free(entry)
        return entry

    def expire(self, now: float, *, quarantine_s: float) -> Expiry:
        """Settle every deadline at or before `now`.

        Lapsed save leases quarantine their entry for `quarantine_s` (a late copy may still land);
        ended quarantines
        free their blocks; lapsed grants are released; lapsed announcements are reported.
        """
        out = Expiry()
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            deadline, _, key, kind, token = heapq.heappop(heap)
            entry = self._entries.get(key)
            if entry is None:
                continue
            if kind is _Deadline.SAVE:
                if entry.phase is Phase.NOT_READY and entry.ready_deadline <= now:
                    out.save_lapsed.append(key)
                    self.quarantine(key, now=now, quarantine_s=quarantine_s)
            elif kind is _Deadline.GRANT:
                if entry.grants.get(token) == deadline:
                    entry.release_grant(token)
                    out.grants_released.append((key, token))
            elif kind is _Deadline.ANNOUNCE:
                # Re-announcing to the same deadline leaves several heap items for one end.
                if entry.announced_until == deadline and key not in out.announcements_ended:
                    out.announcements_ended.append(key)
            elif kind is _Deadline.QUARANTINE:
                if entry.phase is Phase.QUARANTINED and entry.quarantined_until <= now:
                    self._free(entry)
                    out.quarantines_settled.append(entry)
        return out

    def _require(self, key: str) -> Entry:
        entry = self._entries.get(key)
        if entry is None:
            raise UnknownEntry(key)
        return entry

    def _free(self, entry: Entry) -> None:
        del self._entries[entry.key]
        self.blocks.release(entry.extents)

    def _push(self, deadline: float, key: str, kind: _Deadline, token: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._deadlines, (deadline, self._seq, key, kind, token))
