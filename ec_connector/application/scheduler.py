"""The scheduler side of the local tier: which items load, which save, and what completed.

Runs in the engine-core process. It owns the entry table; workers learn what to copy from the
`StepPlan` this service hands out, and report back through the region's completion table, so
completion reaches this side on every model runner (worker metadata is never needed).

The table is also read by the P2P services, whose producer side answers peers from an I/O thread:
every public method holds `lock`, and so must any other user of `table`, with one exception:
`has_item`, vLLM's per-item lookup, reads an entry's phase without `lock` once the step has
polled (see there for why that is safe).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import structlog

from ec_connector.application.stats import Occupancy, TierStats
from ec_connector.domain.cache import EntryTable, Expiry, Reservation
from ec_connector.domain.config import ConnectorConfig
from ec_connector.domain.entries import Entry, Phase
from ec_connector.domain.layout import Layout
from ec_connector.domain.transfers import CacheEvent, Completion, EventKind, PlannedCopy, StepPlan
from ec_connector.logging import debug_enabled
from ec_connector.ports.region import Region
from ec_connector.ports.runtime import Clock, EventSink

log = structlog.get_logger(__name__)
_debug = debug_enabled(__name__)
_READY = Phase.READY


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
        self._grant_lapse_listeners: list[Callable[[str, int], None]] = []
        self.lock = threading.RLock()
        self.stats = TierStats()

    @property
    def engine_id(self) -> str:
        return self._engine_id

    @property
    def table(self) -> EntryTable:
        return self._table

    @property
    def layout(self) -> Layout:
        return self._layout

    def account_evictions(self, reservation: Reservation) -> None:
        """Count and announce entries a reservation evicted (hold `lock`)."""
        for victim in reservation.evicted:
            self.stats.evictions += 1
            self._publish(EventKind.EVICTED, victim.key, victim.rows)
        self.stats.evictions_for_runs += reservation.for_runs

    def reserve_for_peer(self, key: str, rows: int, *, now: float, lease_s: float) -> Reservation | None:
        """Reserve blocks for an item a peer will write (a P2P fetch), as a save would be reserved:
        never evicting an item vLLM was promised this step; evictions counted and announced."""
        with self.lock:
            reservation = self._table.reserve(key, rows, now=now, lease_s=lease_s, protect=self._promised)
            if reservation is not None:
                self.account_evictions(reservation)
            return reservation

    def on_grant_lapsed(self, listener: Callable[[str, int], None]) -> None:
        """Call `listener(key, grant_id)` (under `lock`) for each grant whose pin lease lapses."""
        self._grant_lapse_listeners.append(listener)

    def publish_event(self, kind: EventKind, key: str, rows: int) -> None:
        """Hand a cache event to the event sink (sizes in bytes of this region's layout)."""
        self._publish(kind, key, rows)

    def has_item(self, key: str) -> bool:
        """True when `key` can be reloaded from the tier (consumer or both roles only).

        A True answer protects the entry from eviction until this step's plan is taken.

        Only the step's first call takes `lock` (to poll). The rest is one dict read of the entry's
        phase, safe without `lock`: a dict read is atomic, and a READY entry stays READY until
        this thread evicts it. The producer's I/O thread does change the table (it grants and
        releases, and it polls: completions turn entries READY, expiry ends leases and frees
        QUARANTINED entries), but it never evicts or frees a READY entry; a NOT_READY read that
        races a completion is only a miss. `_promised` and the hit/miss counters are this
        thread's alone.
        """
        if not self._polled:
            with self.lock:
                self._poll_once_per_step()
        if not self._role_loads:
            return False
        if self._phase_of(key) is _READY:
            self.stats.hits += 1
            self._promised.add(key)
            return True
        self.stats.misses += 1
        return False

    def promise(self, key: str) -> None:
        """Protect `key` from eviction until this step's plan is taken, as a True `has_item` does:
        for a READY item a request has no media for, from the check that admits the request to
        vLLM's own `has_cache_item` later in the step (an eviction in between would send that
        request to the encoder with nothing to encode)."""
        self._promised.add(key)

    def on_allocated(self, key: str, rows: int) -> None:
        """vLLM made room for item `key` of `rows` rows: plan its reload, or its offload."""
        with self.lock:
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
        with self.lock:
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
        with self.lock:
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
        with self.lock:
            self._poll()
            return bool(self._pending or self._saves or self._loads)

    def occupancy(self) -> Occupancy:
        with self.lock:
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

    def _plan_save(self, key: str, rows: int, now: float) -> None:
        reservation = self._table.reserve(
            key, rows, now=now, lease_s=self._config.save_lease_s, protect=self._promised
        )
        if reservation is None:
            self.stats.not_offloaded += 1
            if _debug():
                log.debug("offload_skipped_region_full", mm_hash=key, rows=rows)  # counted: not_offloaded
            return
        self.account_evictions(reservation)
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
        for key, grant_id in expiry.grants_released:
            for listener in self._grant_lapse_listeners:
                listener(key, grant_id)
        for key in expiry.announcements_ended:
            entry = self._table.get(key)
            self._publish(EventKind.EXPIRED, key, entry.rows if entry else 0)

    def _publish(self, kind: EventKind, key: str, rows: int) -> None:
        self._events.publish(CacheEvent(kind, key, self._engine_id, rows * self._row_bytes))
