"""The entry table: entries by identifier over one extent allocator.

Rules held here:
- an entry is keyed by its item identifier and owns its extents until it is freed;
- space is made by evicting READY, unpinned, unannounced entries, in the order of the table's
  eviction policy (`domain/eviction.py`): `fifo`, reservation order with an entry sent to the back
  of the queue when its last pin or grant is released (it was just read: a load or a peer's READ),
  as vLLM's EmbeddingCache re-queues an entry on unpin; or `duel`, `s3fifo` and `lecar`, which keep
  what is requested again (`duel` and `s3fifo` let copies pulled from peers, `mark_copy`, go
  first). The table
  counts reads (pins and grants) for the policy and tells it what became evictable; the policy
  never evicts by itself;
- an allocation that cannot fit even after evicting every evictable entry fails at once and evicts
  nothing;
- with a run floor (`min_run` blocks), an entry that has to be split is placed in pieces of at
  least that length: the table evicts the policy's next victims, at most as many blocks as the entry
  itself, until the free space splits that way, and places it in shorter runs only when even that
  does not help (a full cache that evicts exactly what it needs would otherwise hand every new
  entry the slivers its out-of-order frees left, and short runs copy slowly: `bench/aging.py`);
- with a run cap (`max_runs`), the floor of a split entry rises to its share of the entry
  (`rows / max_runs`), so the entry is placed in at most `max_runs` runs on the same terms: each
  run is one copy the driver is handed at launch, and a full, aged tier without the cap left large
  entries in 4-9 runs on average (p99 19-61; `bench/aging.py`);
- deadlines (save lease, producer grant lease, announcement, quarantine) are settled by `expire`,
  which the caller runs with the current time; the table never reads a clock.

Costs: metadata is O(entries) (plus outstanding grants, and the policy's ghost keys). The evictable
entries are kept apart (a map, a running count of their blocks, and the policy's queue), so a
reservation that cannot fit fails in O(1) and one that evicts costs the policy's price per victim
(O(log entries) for `fifo`, O(1) amortised for the others); a lookup is one dict read (`phase_of`).
Heaps and queues with lazily deleted items are rebuilt from the live state whenever they have
doubled since the last rebuild, so stale items never outnumber live ones by more than a constant.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Container, Set
from dataclasses import dataclass, field
from enum import Enum

from ec_connector.domain.blocks import ExtentAllocator
from ec_connector.domain.entries import Entry, Phase
from ec_connector.domain.errors import IllegalTransition, UnknownEntry
from ec_connector.domain.eviction import FIFO, CopyAwarePolicy, EvictionPolicy, make_policy


class _Deadline(Enum):
    SAVE = 0
    GRANT = 1
    ANNOUNCE = 2
    QUARANTINE = 3


@dataclass(frozen=True, slots=True)
class Reservation:
    """A new NOT_READY entry, and the entries evicted to make room for it.

    The last `for_runs` of `evicted` were evicted beyond the space needed, so that the entry's runs
    stay at least the table's run floor long.
    """

    entry: Entry
    evicted: tuple[Entry, ...]
    for_runs: int = 0


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


_READY = Phase.READY
_NOT_READY = Phase.NOT_READY
_QUARANTINED = Phase.QUARANTINED
_NEVER = float("-inf")
_MIN_COMPACT = 64  # a heap is not rebuilt below this many items


class EntryTable:
    """Entries of one region, keyed by identifier, in reservation order; evicted in the order of
    the eviction policy named `eviction` (`domain/eviction.py`: "fifo", "s3fifo", "lecar")."""

    def __init__(self, num_blocks: int, *, min_run: int = 1, max_runs: int = 0, eviction: str = FIFO) -> None:
        if min_run <= 0:
            raise ValueError(f"min_run must be >= 1, got {min_run}")
        if max_runs < 0:
            raise ValueError(f"max_runs must be >= 0 (0: no cap), got {max_runs}")
        self.blocks = ExtentAllocator(num_blocks)
        self.min_run = min_run
        self.max_runs = max_runs
        self._entries: dict[str, Entry] = {}
        self._phases: dict[str, Phase] = {}
        # The phase of `key`, or None when it is not held: one dict read, no Python frame. Phases
        # change only inside this table, so a caller may read them without its own lock.
        self.phase_of: Callable[[str], Phase | None] = self._phases.get
        self._deadlines: list[tuple[float, int, str, _Deadline, int]] = []
        self._deadlines_compact_at = _MIN_COMPACT
        self._seq = 0
        self._order = 0
        # Evictable bookkeeping. An entry is a candidate when READY with no pins and no grants; a
        # candidate whose announcement ends at or before `_horizon` (the latest `now` seen) is in
        # `_evictable`, the others wait in `_held` (by announcement end) until time passes it.
        self._horizon = _NEVER
        self._evictable: dict[str, Entry] = {}
        self._evictable_rows = 0
        self._policy: EvictionPolicy = make_policy(
            eviction, num_blocks=num_blocks, evictable=self._evictable, min_compact=_MIN_COMPACT
        )
        self._held: list[tuple[float, int, str]] = []  # (announced_until, order, key), lazily deleted
        self._held_compact_at = _MIN_COMPACT

    @property
    def eviction(self) -> str:
        """The eviction policy's name."""
        return self._policy.name

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
        return self._phases.get(key) is _READY

    def evictable_blocks(self, now: float, protect: Container[str] = ()) -> int:
        if now < self._horizon:
            return sum(e.rows for e in self._evictable_at(now, protect))
        self._advance(now)
        return self._evictable_rows - self._protected_rows(protect)

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
        """Add a NOT_READY entry of `rows` blocks, evicting if needed; None if it cannot fit.

        Entries whose keys are in `protect` are not evicted (e.g. items promised to vLLM this
        step). On None nothing was evicted. Raises IllegalTransition if `key` is already held.
        With a run floor or cap, up to `rows` more blocks may be evicted to keep the entry's runs
        long and few (`Reservation.for_runs`).
        """
        if key in self._entries:
            raise IllegalTransition(f"entry {key!r} is already held")
        if rows <= 0:
            raise ValueError(f"entry {key!r}: cannot reserve {rows} rows")
        blocks = self.blocks
        if rows > blocks.num_blocks:
            return None
        evicted: list[Entry] = []
        if rows > blocks.free_blocks:
            victims = self._victims(rows - blocks.free_blocks, now, protect)
            if victims is None:
                return None
            for victim in victims:
                self._free(victim)
            evicted = victims
        needed = len(evicted)
        min_run = self.min_run_for(rows)
        extents = blocks.allocate(rows, min_run=min_run)
        budget = rows
        while extents is None and budget > 0:
            more = self._victims(1, now, protect)
            if not more:
                break
            self._free(more[0])
            evicted.append(more[0])
            budget -= more[0].rows
            extents = blocks.allocate(rows, min_run=min_run)
        if extents is None:
            extents = blocks.allocate(rows)  # short runs rather than no entry
            assert extents is not None  # guaranteed by the evictions above
        self._order += 1
        entry = Entry(key=key, extents=extents, rows=rows, ready_deadline=now + lease_s, order=self._order)
        self._entries[key] = entry
        self._phases[key] = _NOT_READY
        self._policy.reserved(entry)
        self._push(entry.ready_deadline, key, _Deadline.SAVE)
        return Reservation(entry, tuple(evicted), len(evicted) - needed)

    def min_run_for(self, rows: int) -> int:
        """The shortest run a split entry of `rows` blocks may be given: the floor, or its share
        under the cap (at most `max_runs` pieces of at least `rows / max_runs` cover it)."""
        if self.max_runs:
            return max(self.min_run, -(-rows // self.max_runs))
        return self.min_run

    def mark_ready(self, key: str) -> Entry:
        entry = self._require(key)
        entry.mark_ready()
        self._phases[key] = _READY
        self._refresh(entry)
        return entry

    def mark_copy(self, key: str) -> Entry:
        """The NOT_READY entry `key` is a copy of an item a live peer still holds (a fleet pull):
        the eviction policy may let it go before the entries this replica encoded (`duel`, `s3fifo`:
        first of all, unless it is read here again; `fifo`: no difference). Raises
        IllegalTransition once the entry is READY (it has taken its queue place by then)."""
        entry = self._require(key)
        if entry.phase is not _NOT_READY:
            raise IllegalTransition(f"entry {key!r}: only a reservation can be marked a copy")
        policy = self._policy
        if isinstance(policy, CopyAwarePolicy):  # once per pull: the check's cost is no concern
            policy.copied(entry)
        return entry

    def extend_ready_deadline(self, key: str, deadline: float) -> None:
        self._require(key).extend_ready_deadline(deadline)
        self._push(deadline, key, _Deadline.SAVE)

    def pin(self, key: str) -> Entry:
        entry = self._require(key)
        entry.pin()
        self._policy.read(entry)
        self._unlist(entry)
        return entry

    def unpin(self, key: str) -> Entry:
        entry = self._require(key)
        entry.unpin()
        if not entry.pins:
            self._requeue(entry)
        return entry

    def grant(self, key: str, grant_id: int, *, now: float, lease_s: float) -> Entry:
        entry = self._require(key)
        entry.grant(grant_id, now + lease_s)
        self._policy.read(entry)
        self._unlist(entry)
        self._push(now + lease_s, key, _Deadline.GRANT, grant_id)
        return entry

    def release_grant(self, key: str, grant_id: int) -> bool:
        entry = self._entries.get(key)
        if entry is None or not entry.release_grant(grant_id):
            return False
        self._requeue(entry)
        return True

    def announce(self, key: str, *, now: float, lease_s: float) -> Entry:
        """Hold `key` out of eviction until `now + lease_s` (a peer was told it may read it);
        a lease of 0 holds nothing: the entry stays where the eviction order has it."""
        entry = self._require(key)
        if lease_s < 0:
            raise ValueError(f"announce lease_s must be >= 0, got {lease_s}")
        if lease_s == 0:
            return entry
        entry.announce(now + lease_s)
        self._refresh(entry)
        self._push(now + lease_s, key, _Deadline.ANNOUNCE)
        return entry

    def quarantine(self, key: str, *, now: float, quarantine_s: float) -> Entry:
        """Hold a NOT_READY entry's blocks unusable until `now + quarantine_s`."""
        entry = self._require(key)
        entry.quarantine(now + quarantine_s)
        self._phases[key] = _QUARANTINED
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
                    self.release_grant(key, token)
                    out.grants_released.append((key, token))
            elif kind is _Deadline.ANNOUNCE:
                # Re-announcing to the same deadline leaves several heap items for one end.
                if entry.announced_until == deadline and key not in out.announcements_ended:
                    out.announcements_ended.append(key)
            elif kind is _Deadline.QUARANTINE:
                if entry.phase is Phase.QUARANTINED and entry.quarantined_until <= now:
                    self._free(entry)
                    out.quarantines_settled.append(entry)
        if now >= self._horizon:
            self._advance(now)
        return out

    # --- internals -----------------------------------------------------------------------------

    def _require(self, key: str) -> Entry:
        entry = self._entries.get(key)
        if entry is None:
            raise UnknownEntry(key)
        return entry

    def _free(self, entry: Entry) -> None:
        key = entry.key
        del self._entries[key]
        del self._phases[key]
        if self._evictable.pop(key, None) is not None:
            self._evictable_rows -= entry.rows
        self._policy.freed(entry)
        self.blocks.release(entry.extents)

    def _push(self, deadline: float, key: str, kind: _Deadline, token: int = 0) -> None:
        self._seq += 1
        heap = self._deadlines
        heapq.heappush(heap, (deadline, self._seq, key, kind, token))
        if len(heap) > self._deadlines_compact_at:
            heap[:] = [item for item in heap if self._deadline_is_live(item)]
            heapq.heapify(heap)
            self._deadlines_compact_at = max(_MIN_COMPACT, 2 * len(heap))

    def _deadline_is_live(self, item: tuple[float, int, str, _Deadline, int]) -> bool:
        """False for a heap item that can no longer settle anything (its entry moved past it)."""
        deadline, _, key, kind, token = item
        entry = self._entries.get(key)
        if entry is None:
            return False
        if kind is _Deadline.SAVE:
            # An older, shorter save lease of an extended entry: the item of the current one stays.
            return entry.phase is _NOT_READY and entry.ready_deadline == deadline
        if kind is _Deadline.GRANT:
            return entry.grants.get(token) == deadline
        if kind is _Deadline.ANNOUNCE:
            return entry.announced_until == deadline
        return entry.phase is _QUARANTINED and entry.quarantined_until == deadline

    # Evictable bookkeeping: `_refresh` after anything that can make an entry evictable, `_unlist`
    # after anything that makes it a non-candidate (pin, grant); `_free` forgets it.

    def _refresh(self, entry: Entry) -> None:
        if entry.phase is not _READY or entry.pins or entry.grants:
            self._unlist(entry)
            return
        key = entry.key
        if entry.announced_until > self._horizon:
            self._unlist(entry)
            self._held_push(entry)
        elif key not in self._evictable:
            self._list(entry)

    def _requeue(self, entry: Entry) -> None:
        """A pin or grant was released: once none is left, the entry takes a new queue number (the
        back of the `fifo` queue)."""
        if not entry.pins and not entry.grants:
            self._order += 1
            entry.order = self._order
        self._refresh(entry)

    def _list(self, entry: Entry) -> None:
        self._evictable[entry.key] = entry
        self._evictable_rows += entry.rows
        self._policy.listed(entry)

    def _unlist(self, entry: Entry) -> None:
        if self._evictable.pop(entry.key, None) is not None:
            self._evictable_rows -= entry.rows

    def _held_push(self, entry: Entry) -> None:
        held = self._held
        heapq.heappush(held, (entry.announced_until, entry.order, entry.key))
        if len(held) > self._held_compact_at:
            held[:] = [item for item in held if self._held_is_live(item)]
            heapq.heapify(held)
            self._held_compact_at = max(_MIN_COMPACT, 2 * len(held))

    def _held_is_live(self, item: tuple[float, int, str]) -> bool:
        until, order, key = item
        entry = self._entries.get(key)
        return entry is not None and entry.order == order and entry.announced_until == until

    def _advance(self, now: float) -> None:
        """Move the horizon to `now`: candidates whose announcement ended by then become evictable."""
        self._horizon = now
        held = self._held
        while held and held[0][0] <= now:
            until, order, key = heapq.heappop(held)
            entry = self._entries.get(key)
            if entry is not None and entry.order == order and entry.announced_until == until:
                self._refresh(entry)

    def _protected_rows(self, protect: Container[str]) -> int:
        """Blocks of evictable entries whose keys are in `protect`."""
        if not protect:
            return 0
        evictable = self._evictable
        if isinstance(protect, Set) and len(protect) <= len(evictable):
            return sum(evictable[k].rows for k in protect if k in evictable)
        return sum(e.rows for k, e in evictable.items() if k in protect)

    def _evictable_at(self, now: float, protect: Container[str]) -> list[Entry]:
        """The entries evictable at a `now` before the horizon, in eviction order (time went back)."""
        found = [e for k, e in self._evictable.items() if e.announced_until <= now and k not in protect]
        found.sort(key=self._policy.rank)
        return found

    def _victims(self, needed: int, now: float, protect: Container[str]) -> list[Entry] | None:
        """The policy's next evictable entries freeing at least `needed` blocks; None (nothing
        taken) if even all of them would not."""
        if now < self._horizon:
            victims: list[Entry] = []
            for entry in self._evictable_at(now, protect):
                if needed <= 0:
                    break
                victims.append(entry)
                needed -= entry.rows
            return victims if needed <= 0 else None
        self._advance(now)
        if needed > self._evictable_rows - self._protected_rows(protect):
            return None
        return self._policy.victims(needed, protect)
