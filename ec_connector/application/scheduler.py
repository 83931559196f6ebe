"""The scheduler side of the local tier: which items load, which save, and what completed.

Runs in the engine-core process. It owns the entry table; workers learn what to copy from the
`StepPlan` this service hands out, and report back through the region's completion table, so
completion reaches this side on every model runner (worker metadata is never needed).

It is the one owner of the entry table and of the lock that guards it: the P2P services (the
producer desk answers peers from an I/O thread) and the vLLM entry point call its intent methods
(announce, grant, release a grant, reserve/finish/fail a peer fetch, a stats snapshot), each of
which holds the lock for its own table operations. Nothing else touches the table or the lock, so
the locking rule lives in this module alone (tests/test_architecture.py checks it). One read
skips the lock: `has_item`, vLLM's per-item lookup, reads an entry's phase without it once the
step has polled (see there for why that is safe).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import Enum

import structlog

from ec_connector.application.stats import Occupancy, TierSnapshot, TierStats
from ec_connector.domain.cache import EntryTable, Expiry, Reservation
from ec_connector.domain.config import ConnectorConfig
from ec_connector.domain.entries import Entry, Phase
from ec_connector.domain.layout import Layout
from ec_connector.domain.protocol import AckStatus, XferReq, answer_status, fits_one_ack
from ec_connector.domain.transfers import CacheEvent, Completion, EventKind, PlannedCopy, StepPlan
from ec_connector.logging import debug_enabled
from ec_connector.ports.region import Region
from ec_connector.ports.runtime import Clock, EventSink

log = structlog.get_logger(__name__)
_debug = debug_enabled(__name__)
_READY = Phase.READY
_NOT_READY = Phase.NOT_READY


class _Kind(Enum):
    SAVE = "save"
    LOAD = "load"


@dataclass(slots=True)
class _Pending:
    kind: _Kind
    key: str
    waiting_on: set[int]
    started: float
    size_bytes: int
    failed: bool = field(default=False)


@dataclass(frozen=True, slots=True)
class Grant:
    """One producer grant: a pin on `key` while `holder` (a consumer engine) READs its blocks.

    `runs` are the entry's (offset, length) byte runs in the region, as the ack carries them.
    """

    grant_id: int
    key: str
    holder: str
    granted_at: float
    rows: int
    size_bytes: int
    runs: tuple[tuple[int, int], ...]


class TierScheduler:
    """Scheduler-side use cases: lookups, offload/reload planning, completion, lease expiry."""

    def __init__(
        self,
        *,
        config: ConnectorConfig,
        region: Region,
        clock: Clock,
        events: EventSink,
        ranks: int,
        engine_id: str,
    ) -> None:
        if ranks <= 0:
            raise ValueError(f"ranks must be > 0, got {ranks}")
        self._config = config
        self._region = region
        self._layout = region.layout
        self._row_bytes = region.layout.block_size_bytes
        self._clock = clock
        self._events = events
        self._ranks = ranks
        self._engine_id = engine_id
        self._table = EntryTable(
            self._layout.num_blocks,
            min_run=self._layout.blocks_for(config.min_run_bytes),
            max_runs=config.max_entry_runs,
            eviction=config.eviction,
        )
        self._phase_of = self._table.phase_of
        self._role_loads = config.role.loads
        self._tickets = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._save_ticket: dict[str, int] = {}
        self._saves: list[PlannedCopy] = []
        self._loads: list[PlannedCopy] = []
        self._planned_keys: set[str] = set()
        self._promised: set[str] = set()
        self._polled = False
        self._grant_ids = itertools.count(1)
        self._grants: dict[int, Grant] = {}
        self._grant_lapse_listeners: list[Callable[[Grant], None]] = []
        self._lock = threading.RLock()
        self.stats = TierStats()
        """The counters, for reading on the step thread; `snapshot()` takes them consistently."""

    @property
    def engine_id(self) -> str:
        return self._engine_id

    @property
    def layout(self) -> Layout:
        return self._layout

    # -- inspection: detached copies, for tests, tools and logs ---------------------------

    def entry(self, key: str) -> Entry | None:
        """A copy of `key`'s entry (None when absent): changing it changes nothing in the tier."""
        with self._lock:
            entry = self._table.get(key)
            return None if entry is None else _detached(entry)

    def entries(self) -> tuple[Entry, ...]:
        """Copies of every entry, in no particular order."""
        with self._lock:
            return tuple(_detached(entry) for entry in self._table.entries())

    def holds(self, key: str) -> bool:
        """True when `key` has an entry in any phase (its blocks are taken)."""
        return key in self._table  # one dict read: atomic, as in `has_item`

    def is_ready(self, key: str) -> bool:
        """True when `key`'s bytes are in the region (READY), whatever the role."""
        return self._phase_of(key) is _READY  # one dict read: atomic, as in `has_item`

    def snapshot(self) -> TierSnapshot:
        """The counters, the latencies observed since the last snapshot (taken: emptied), and the
        occupancy, read together under the lock (the producer's I/O thread may be polling)."""
        with self._lock:
            return TierSnapshot(
                counters=self.stats.as_dict(),
                samples=self.stats.latencies.take(),
                occupancy=self._occupancy(),
            )

    def evict(self, key: str) -> bool:
        """Evict `key` now, as pressure would: only a READY entry that nothing holds (no pin, grant
        or live announcement); counted and published as an eviction. True when it was evicted.
        Benches and tests use it to make the next lookup of an item miss."""
        with self._lock:
            entry = self._table.get(key)
            if entry is None or not entry.is_evictable(self._clock.now()):
                return False
            self._table.drop(key)
            self.stats.evictions += 1
            self._publish(EventKind.EVICTED, key, entry.rows)
            return True

    # -- P2P, producer side ----------------------------------------------------------------

    def announce(self, keys: Iterable[str], *, lease_s: float) -> dict[str, int]:
        """Announce the servable ones of `keys`, held for `lease_s` (they survive until read, or the
        lease ends; 0: not held, they stay in the eviction order); their size in bytes by key.
        Servable: held (saved or still saving), not quarantined, and few enough runs for one ack.
        Each announcement is published as an event."""
        servable: dict[str, int] = {}
        with self._lock:
            now = self._clock.now()
            for key in keys:
                entry = self._table.get(key)
                if entry is None or entry.phase is Phase.QUARANTINED or not fits_one_ack(entry):
                    continue
                self._table.announce(key, now=now, lease_s=lease_s)
                servable[key] = entry.rows * self._row_bytes
                self._publish(EventKind.ANNOUNCED, key, entry.rows)
        return servable

    def grant(self, req: XferReq, *, fingerprint: str, lease_s: float) -> tuple[AckStatus, Grant | None]:
        """The producer's answer to `req`: OK with a grant (a pin on the entry under `lease_s`,
        ended by `release_grant` or by lapsing), or a refusal and None (thread-safe).

        An entry still saving is checked again after reading the completion table: the save may
        have landed since the engine last stepped (an idle engine does not step).
        """
        with self._lock:
            entry = self._table.get(req.mm_hash)
            if entry is not None and entry.phase is Phase.NOT_READY:
                self._poll()
                entry = self._table.get(req.mm_hash)
            status = answer_status(req, fingerprint=fingerprint, entry=entry)
            if status is not AckStatus.OK or entry is None:
                return status, None
            grant_id = next(self._grant_ids)
            now = self._clock.now()
            self._table.grant(req.mm_hash, grant_id, now=now, lease_s=lease_s)
            size = entry.rows * self._row_bytes
            runs = self._layout.byte_runs(entry.extents)
            grant = Grant(grant_id, req.mm_hash, req.consumer, now, entry.rows, size, runs)
            self._grants[grant_id] = grant
            return status, grant

    def release_grant(self, key: str, grant_id: int) -> Grant | None:
        """End grant `grant_id` on `key` (its consumer's READ ended); the grant, or None when it was
        not held (lapsed already, or never granted). Thread-safe."""
        with self._lock:
            if not self._table.release_grant(key, grant_id):
                return None
            return self._grants.pop(grant_id, None)

    def on_grant_lapsed(self, listener: Callable[[Grant], None]) -> None:
        """Call `listener(grant)` (under the lock, keep it short) for each grant whose lease lapses."""
        self._grant_lapse_listeners.append(listener)

    # -- P2P, consumer side ----------------------------------------------------------------

    def reserve_fetch(self, key: str, rows: int, *, now: float, lease_s: float) -> Reservation | None:
        """Reserve blocks for an item a peer will write (a P2P fetch), as a save would be reserved:
        never evicting an item vLLM was promised this step; evictions counted and announced.
        None when the region cannot take it. The fetch ends with `finish_fetch` or `fail_fetch`."""
        with self._lock:
            reservation = self._table.reserve(key, rows, now=now, lease_s=lease_s, protect=self._promised)
            if reservation is not None:
                self._account_evictions(reservation)
            return reservation

    def mark_copy(self, key: str) -> bool:
        """The fetch reserved for `key` pulls a copy of an item a live peer holds (a fleet pull, not
        params an orchestrator forwarded): the eviction policy lets it go before the entries this
        replica encoded (`EntryTable.mark_copy`). False, changing nothing, when `key` is not a
        fetch whose bytes are still arriving."""
        with self._lock:
            entry = self._table.get(key)
            if entry is None or entry.phase is not Phase.NOT_READY:
                return False
            self._table.mark_copy(key)
            return True

    def finish_fetch(self, key: str) -> None:
        """The bytes of the fetch reserved for `key` are in place: the entry is READY (and stored,
        as an event)."""
        with self._lock:
            entry = self._table.mark_ready(key)
            self._publish(EventKind.STORED, key, entry.rows)

    def fail_fetch(self, key: str, *, now: float, quarantine_s: float | None = None) -> bool:
        """Give up the fetch reserved for `key`: its blocks are freed, or, with `quarantine_s`
        (a DMA may still write them), held unusable that long from `now`. A no-op unless the entry is still
        NOT_READY. True when it was quarantined."""
        with self._lock:
            entry = self._table.get(key)
            if entry is None or entry.phase is not Phase.NOT_READY:
                return False
            if quarantine_s is None:
                self._table.drop(key)
                return False
            self._table.quarantine(key, now=now, quarantine_s=quarantine_s)
            return True

    # -- vLLM's scheduler-side hooks -------------------------------------------------------

    def has_item(self, key: str) -> bool:
        """True when `key` can be reloaded from the tier (consumer or both roles only).

        A True answer protects the entry from eviction until this step's plan is taken.

        Only the step's first call takes the lock (to poll). The rest is one dict read of the entry's
        phase, safe without the lock: a dict read is atomic, and a READY entry stays READY until
        this thread evicts it. The producer's I/O thread does change the table (it grants and
        releases, and it polls: completions turn entries READY, expiry ends leases and frees
        QUARANTINED entries), but it never evicts or frees a READY entry; a NOT_READY read that
        races a completion is only a miss. `_promised` and the hit/miss counters are this
        thread's alone.
        """
        if not self._polled:
            with self._lock:
                self._poll_once_per_step()
        if not self._role_loads:
            return False
        phase = self._phase_of(key)
        if phase is _READY:
            self.stats.hits += 1
            self._promised.add(key)
            return True
        self.stats.misses += 1
        if phase is _NOT_READY:
            self.stats.misses_saving += 1
        return False

    def promise(self, key: str) -> None:
        """Protect `key` from eviction until this step's plan is taken, as a True `has_item` does:
        for a READY item a request has no media for, from the check that admits the request to
        vLLM's own `has_cache_item` later in the step (an eviction in between would send that
        request to the encoder with nothing to encode)."""
        self._promised.add(key)

    def on_allocated(self, key: str, rows: int) -> None:
        """vLLM made room for item `key` of `rows` rows: plan its reload, or its offload."""
        with self._lock:
            self._on_allocated(key, rows)

    def _on_allocated(self, key: str, rows: int) -> None:
        self._poll_once_per_step()
        if key in self._planned_keys:
            return
        entry = self._table.get(key)
        now = self._clock.now()
        if entry is not None and entry.is_ready and self._config.role.loads:
            self._table.pin(key)
            self._loads.append(self._plan(_Kind.LOAD, entry, now))
            self.stats.loads_planned += 1
        elif entry is None and self._config.role.saves:
            self._plan_save(key, rows, now)

    def take_plan(self) -> StepPlan:
        """This step's copies for the workers; resets the step."""
        with self._lock:
            return self._take_plan()

    def _take_plan(self) -> StepPlan:
        self._poll_once_per_step()
        plan = StepPlan(saves=tuple(self._saves), loads=tuple(self._loads))
        self._saves, self._loads = [], []
        self._planned_keys.clear()
        self._promised.clear()
        self._polled = False
        return plan

    def poll(self) -> None:
        """Apply completions the workers posted and settle every lapsed deadline."""
        with self._lock:
            self._poll()

    def _poll(self) -> None:
        before = (self.stats.saves_done, self.stats.loads_done)
        now = self._clock.now()  # one reading for the drained batch's latencies and the expiry
        for completion in self._region.drain_completions():
            self._complete(completion, now)
        saved, loaded = self.stats.saves_done - before[0], self.stats.loads_done - before[1]
        if (saved or loaded) and _debug():
            log.debug("tier_copies_completed", saves=saved, loads=loaded, engine_id=self._engine_id)
        expiry = self._table.expire(now, quarantine_s=self._config.quarantine_s)
        if expiry:
            self._settle(expiry)

    def has_pending_work(self) -> bool:
        """True while a planned copy has not completed on every rank it involves."""
        with self._lock:
            self._poll()
            return bool(self._pending or self._saves or self._loads)

    def occupancy(self) -> Occupancy:
        with self._lock:
            return self._occupancy()

    def _occupancy(self) -> Occupancy:
        blocks = self._table.blocks
        size = self._layout.block_size_bytes
        return Occupancy(
            entries=len(self._table),
            used_blocks=blocks.used_blocks,
            free_blocks=blocks.free_blocks,
            used_bytes=blocks.used_blocks * size,
            capacity_bytes=self._layout.data_bytes,
        )

    def _poll_once_per_step(self) -> None:
        if not self._polled:
            self._polled = True
            self._poll()

    def _account_evictions(self, reservation: Reservation) -> None:
        """Count and announce entries a reservation evicted (hold the lock)."""
        for victim in reservation.evicted:
            self.stats.evictions += 1
            self._publish(EventKind.EVICTED, victim.key, victim.rows)
        self.stats.evictions_for_runs += reservation.for_runs

    def _plan_save(self, key: str, rows: int, now: float) -> None:
        reservation = self._table.reserve(
            key, rows, now=now, lease_s=self._config.save_lease_s, protect=self._promised
        )
        if reservation is None:
            self.stats.not_offloaded += 1
            if _debug():
                log.debug("offload_skipped_region_full", mm_hash=key, rows=rows)  # counted: not_offloaded
            return
        self._account_evictions(reservation)
        entry = reservation.entry
        copy = self._plan(_Kind.SAVE, entry, now)
        self._save_ticket[key] = copy.ticket
        self._saves.append(copy)
        self.stats.saves_planned += 1

    def _plan(self, kind: _Kind, entry: Entry, now: float) -> PlannedCopy:
        key, rows = entry.key, entry.rows
        ticket = next(self._tickets)
        waiting_on = {0} if kind is _Kind.SAVE else set(range(self._ranks))
        size = rows * self._row_bytes
        self._pending[ticket] = _Pending(kind, key, waiting_on, now, size)
        self._planned_keys.add(key)
        return PlannedCopy(ticket, key, entry.extents, rows, entry.packed_extents())

    def _complete(self, completion: Completion, now: float) -> None:
        pending = self._pending.get(completion.ticket)
        if pending is None or completion.rank not in pending.waiting_on:
            self.stats.unknown_completions += 1
            log.warning("completion_unknown", ticket=completion.ticket, rank=completion.rank)
            return
        pending.waiting_on.discard(completion.rank)
        pending.failed |= not completion.ok
        if pending.waiting_on:
            return
        del self._pending[completion.ticket]
        if pending.kind is _Kind.SAVE:
            self._finish_save(pending, now)
        else:
            self._finish_load(pending, now)

    def _finish_save(self, pending: _Pending, now: float) -> None:
        key = pending.key
        self._save_ticket.pop(key, None)
        entry = self._table.get(key)
        if entry is None or entry.phase is not Phase.NOT_READY:
            self.stats.late_completions += 1
            return
        if pending.failed:
            self._table.drop(key)
            self.stats.saves_failed += 1
            log.warning("offload_failed", mm_hash=key)
            return
        self._table.mark_ready(key)
        self.stats.saves_done += 1
        self.stats.bytes_saved += pending.size_bytes
        self.stats.latencies.observe("save", now - pending.started)
        self._publish(EventKind.STORED, key, entry.rows)

    def _finish_load(self, pending: _Pending, now: float) -> None:
        self._table.unpin(pending.key)
        if pending.failed:
            self.stats.loads_failed += 1
            log.warning("reload_failed", mm_hash=pending.key)
        else:
            self.stats.loads_done += 1
            self.stats.bytes_loaded += pending.size_bytes
            self.stats.latencies.observe("load", now - pending.started)

    def _settle(self, expiry: Expiry) -> None:
        for key in expiry.save_lapsed:
            self.stats.save_leases_lapsed += 1
            ticket = self._save_ticket.pop(key, None)
            if ticket is not None:
                self._pending.pop(ticket, None)
            log.warning("offload_lease_lapsed", mm_hash=key)
        self.stats.quarantines_settled += len(expiry.quarantines_settled)
        self.stats.grants_lapsed += len(expiry.grants_released)
        for _key, grant_id in expiry.grants_released:
            grant = self._grants.pop(grant_id, None)
            if grant is not None:
                for listener in self._grant_lapse_listeners:
                    listener(grant)
        for key in expiry.announcements_ended:
            entry = self._table.get(key)
            self._publish(EventKind.EXPIRED, key, entry.rows if entry else 0)

    def _publish(self, kind: EventKind, key: str, rows: int) -> None:
        self._events.publish(CacheEvent(kind, key, self._engine_id, rows * self._row_bytes))


def _detached(entry: Entry) -> Entry:
    """A copy of `entry` that shares no mutable state with it."""
    return replace(entry, grants=dict(entry.grants))
