"""Fleet-wide sharing: pull an item another replica holds instead of encoding it.

Two halves, on two threads:

- `FleetUpdater` keeps the peer directory (`domain/directory.py`) current from the peers' event
  feeds (their events and hello frames) and the static peer list. It runs on the feed
  subscriber's thread (never the engine's step thread): peers join and beat, report
  `stored`/`announced`/`evicted`/`expired` events, and depart when their feed disconnects (kept
  away when their boot is known, so a reconnect of the same process keeps its records); `tick()`
  drops peers that stopped beating and applies the records the step thread found stale.
- `FleetFetcher` runs on the step thread, in front of `ConsumerFetcher`. For each item of a
  request that the local tier lacks and that no forwarded `ec_transfer_params` name, it reads the
  directory (a dict read) and, when a live peer holds the item and the pull is worth it
  (`PullRule`), hands the item to the existing fetch path as params it synthesizes
  (`{key: {"metadata": {}, "peer_host", "peer_port", "size_bytes"}}`): XferReq, NIXL READ into
  the local region, and every fallback and bound of that path. A pull is not started when the
  local region cannot take it (the fetcher's reservation fails: `region_full`, no request sent).
  A started pull's entry is marked a copy (`TierScheduler.mark_copy`): under `duel` and `s3fifo`
  it is the first to go unless read here again, so replicas sharing a working set keep it about
  once.

Keys are the tier's entry keys (`domain/scope.py`): a request under scope S asks for its scoped
keys, so it can only be served entries stored under S, locally and from peers.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import structlog

from ec_connector.application.consumer import ConsumerFetcher, WantedItem
from ec_connector.application.scheduler import TierScheduler
from ec_connector.domain.directory import Joined, Peer, PeerDirectory
from ec_connector.domain.entries import Phase
from ec_connector.domain.pull_rule import PullRule
from ec_connector.domain.transfers import CacheEvent, EventKind
from ec_connector.ports.runtime import Clock

log = structlog.get_logger(__name__)

RECENT_LOCAL_ROWS = 8192
"""The "allocated here recently" window, in rows, where the engine does not give its encoder
cache size (`scheduler_config.encoder_cache_size`; 8192 is a typical `max_num_batched_tokens`)."""


@dataclass(slots=True)
class FleetStats:
    """Counters of fleet sharing (since start), and two levels (`directory_records`, `peers_live`:
    their value now, which the stats path reports as its change since the previous report, so that
    the reports add up to it). Updater-thread fields and step-thread fields are written by one
    thread each."""

    # the subscriber's thread (FleetUpdater)
    peers_joined: int = 0
    peers_restarted: int = 0
    peers_returned: int = 0
    peers_left: int = 0
    peers_silent: int = 0
    feed_gaps: int = 0
    feed_frames_rejected: int = 0
    events_applied: int = 0
    events_ignored: int = 0
    stale_records_forgotten: int = 0
    directory_records: int = 0
    peers_live: int = 0
    # the step thread (FleetFetcher)
    lookups: int = 0
    located: int = 0
    pulls_started: int = 0
    pulls_done: int = 0
    pulls_failed: int = 0
    pulls_not_started: int = 0
    not_worth_it: int = 0
    size_mismatches: int = 0
    skipped_recent_local: int = 0
    skipped_in_flight_cap: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class FleetUpdater:
    """Feeds the directory from peers' feeds and the static peer list; every method is meant for
    the subscriber's thread (thread-safe: one lock serialises writers). This engine's own feed
    (its engine id, or its `boot` in a hello) is ignored."""

    def __init__(
        self,
        *,
        directory: PeerDirectory,
        clock: Clock,
        engine_id: str,
        heartbeat_timeout_s: float,
        stats: FleetStats,
        boot: str = "",
    ) -> None:
        if heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s must be > 0, got {heartbeat_timeout_s!r}")
        self._directory = directory
        self._clock = clock
        self._engine_id = engine_id
        self._boot = boot
        self._timeout = heartbeat_timeout_s
        self._lock = threading.Lock()
        self._last_seq: dict[str, int] = {}
        self._stale: deque[tuple[str, str]] = deque()  # appended by the step thread, drained here
        self.stats = stats

    def peer_seen(self, peer: Peer) -> bool:
        """`peer` is alive (its feed's handshake or hello, every second while it stays up, or the
        static list): join, beat, return or restart (`PeerDirectory.join`). A restarted peer (new
        boot or address) loses its old records; one back with the same boot keeps them. False when
        it is not served: the directory is full of peers, it waits for its hello, or it is this
        engine."""
        if peer.peer_id == self._engine_id or (peer.boot and peer.boot == self._boot):
            return False
        with self._lock:
            current = self._directory.peer(peer.peer_id)
            if current is not None and (current == peer or not peer.boot) and current.address == peer.address:
                return self._directory.heartbeat(peer.peer_id, now=self._clock.now())
            joined = self._directory.join(peer, now=self._clock.now())
            if joined is Joined.NEW or joined is Joined.RESTARTED:
                self._last_seq.pop(peer.peer_id, None)  # a new process counts its events from 1
            self._levels()
        if joined is Joined.NEW or joined is Joined.RESTARTED:
            self.stats.peers_joined += 1
            self.stats.peers_restarted += joined is Joined.RESTARTED
            log.info(
                "fleet_peer_joined",
                peer=peer.peer_id,
                address=f"{peer.address.host}:{peer.address.port}",
                boot=peer.boot or None,
                restarted=joined is Joined.RESTARTED,
            )
        elif joined is Joined.RETURNED:
            self.stats.peers_returned += 1
            records = self._directory.entries_of(peer.peer_id)
            log.info("fleet_peer_returned", peer=peer.peer_id, records=records)
        return joined is not Joined.REFUSED and joined is not Joined.WAITING

    def apply(self, event: CacheEvent, *, seq: int | None = None) -> bool:
        """Apply one event of peer `event.engine_id`'s feed (`event.mm_hash` is the entry key); any
        event is also a beat. `seq` (the feed's counter) detects missed events: a gap is counted,
        and a record it left stale is forgotten when a pull from it fails. False when ignored (an
        event of a peer that has not joined: there is no address to pull from)."""
        peer_id = event.engine_id
        if peer_id == self._engine_id:
            self.stats.events_ignored += 1
            return False
        with self._lock:
            if seq is not None:
                last = self._last_seq.get(peer_id)
                if last is not None and seq != last + 1:
                    self.stats.feed_gaps += 1
                self._last_seq[peer_id] = seq
            known = self._directory.heartbeat(peer_id, now=self._clock.now())
            if event.kind is EventKind.STORED or event.kind is EventKind.ANNOUNCED:
                applied = self._directory.stored(peer_id, event.mm_hash, event.size_bytes)
            elif event.kind is EventKind.EVICTED:
                applied = self._directory.evicted(peer_id, event.mm_hash)
            else:  # EXPIRED: the announcement ended; the entry stays READY until evicted
                applied = known
            self.stats.directory_records = len(self._directory)
        if applied:
            self.stats.events_applied += 1
        else:
            self.stats.events_ignored += 1
        return applied

    def peer_gone(self, peer_id: str) -> int:
        """`peer_id`'s feed disconnected: it drops out of `locate` at once; its records are kept
        away for one heartbeat timeout when its boot is known (a reconnect of the same process
        serves them again), else dropped. The records dropped."""
        with self._lock:
            known = self._directory.peer(peer_id) is not None
            dropped = self._directory.depart(peer_id, now=self._clock.now())
            if dropped or not known:
                self._last_seq.pop(peer_id, None)
            self._levels()
        if known:
            self.stats.peers_left += 1
            log.info("fleet_peer_left", peer=peer_id, records_dropped=dropped)
        return dropped

    def frame_rejected(self) -> None:
        """A frame of a peer's feed did not decode or authenticate (the subscriber dropped it)."""
        self.stats.feed_frames_rejected += 1

    def note_stale(self, peer_id: str, key: str) -> None:
        """A pull of `key` from `peer_id` failed: forget that record at the next `tick`. Called from
        the step thread (a deque append, atomic)."""
        self._stale.append((peer_id, key))

    def tick(self) -> list[str]:
        """Depart peers silent for longer than the heartbeat timeout, drop the records of peers
        away for longer, and forget stale records; the ids of the peers that fell silent. Call it
        at least every heartbeat interval."""
        with self._lock:
            while self._stale:
                peer_id, key = self._stale.popleft()
                if self._directory.forget(peer_id, key):
                    self.stats.stale_records_forgotten += 1
            silent = self._directory.drop_silent(now=self._clock.now(), timeout_s=self._timeout)
            self._levels()
        for peer_id in silent:
            self.stats.peers_silent += 1
            log.warning("fleet_peer_silent", peer=peer_id, timeout_s=self._timeout)
        return silent

    def _levels(self) -> None:
        """Refresh the directory's levels in the stats (under the lock)."""
        self.stats.directory_records = len(self._directory)
        self.stats.peers_live = len(self._directory.peers())


class FleetFetcher:
    """Step-thread front of `ConsumerFetcher`: adds fleet pulls for local misses the directory can
    serve; the supply of a replica with fleet peers (`poll`, `take_unavailable` and
    `has_pending_work` are the fetcher's). Every method runs on the engine's step thread."""

    def __init__(
        self,
        *,
        tier: TierScheduler,
        fetcher: ConsumerFetcher,
        directory: PeerDirectory,
        updater: FleetUpdater,
        rule: PullRule,
        engine_id: str,
        stats: FleetStats,
        max_pulls_in_flight: int = 64,
        recent_local_rows: int = RECENT_LOCAL_ROWS,
    ) -> None:
        self._tier = tier
        self._fetcher = fetcher
        self._directory = directory
        self._updater = updater
        self._rule = rule
        self._engine_id = engine_id
        self._max_in_flight = max_pulls_in_flight
        self._recent_cap = recent_local_rows
        self._recent: OrderedDict[str, int] = OrderedDict()  # key -> rows, oldest allocation first
        self._recent_rows = 0
        self._pulls: dict[str, str] = {}  # key -> the peer it is pulled from
        self.stats = stats

    def poll(self) -> None:
        self._fetcher.poll()

    def take_unavailable(self) -> set[str]:
        return self._fetcher.take_unavailable()

    def has_pending_work(self) -> bool:
        return self._fetcher.has_pending_work()

    def await_acks(self, budget_s: float) -> None:
        self._fetcher.await_acks(budget_s)

    def await_landed(self, budget_s: float) -> float:
        return self._fetcher.await_landed(budget_s)

    def note_local(self, key: str, rows: int) -> None:
        """vLLM allocated `key` (`rows` encoder rows) in its own encoder cache: it is being encoded
        or loaded here, and vLLM may hold it until its cache's rows are reused, so it is not pulled
        from peers meanwhile. The window is vLLM's encoder cache (`recent_local_rows`: its size in
        rows), oldest allocation dropped first: an item allocated longer ago than that has left
        vLLM's cache, and a miss on it may be served by a peer."""
        self._recent_rows += rows - self._recent.pop(key, 0)
        self._recent[key] = rows
        while self._recent_rows > self._recent_cap and len(self._recent) > 1:
            self._recent_rows -= self._recent.popitem(last=False)[1]

    def ensure_available(self, request_id: str, params: object, items: Sequence[WantedItem]) -> bool:
        """As `ConsumerFetcher.ensure_available`, with fleet pulls added for the items that neither
        the local tier nor `params` cover; params forwarded by an orchestrator take precedence."""
        self._settle()
        named = params if isinstance(params, Mapping) else {}
        synthesized: dict[str, dict[str, Any]] = {}
        for item in items:
            if item.key in named or item.key in self._pulls or self._tier.holds(item.key):
                continue
            params_for = self._pull_params(item)
            if params_for is not None:
                synthesized[item.key] = params_for
        if synthesized and (params is None or isinstance(params, Mapping)):
            merged: object = {**synthesized, **named}
        else:
            merged = params
        done = self._fetcher.ensure_available(request_id, merged, items)
        self._note_started(synthesized)
        return done

    def recheck(self, request_id: str, items: Sequence[WantedItem]) -> bool:
        """As `ConsumerFetcher.recheck`: the pulls that ended are settled, and nothing is looked up
        again (each item was counted once, by `ensure_available`)."""
        self._settle()
        return self._fetcher.recheck(request_id, items)

    def _pull_params(self, item: WantedItem) -> dict[str, Any] | None:
        """Params that make the fetcher pull `item` from a peer, or None (encode here)."""
        self.stats.lookups += 1
        holder = self._directory.locate(item.key)
        if holder is None or holder.peer.peer_id == self._engine_id:
            return None
        self.stats.located += 1
        size = item.rows * self._tier.layout.block_size_bytes
        if holder.size_bytes != size:  # another model or width: the fingerprint would refuse it
            self.stats.size_mismatches += 1
            return None
        if item.key in self._recent:
            self.stats.skipped_recent_local += 1
            return None
        if not self._rule.worth(size, item.rows):
            self.stats.not_worth_it += 1
            return None
        if len(self._pulls) >= self._max_in_flight:
            self.stats.skipped_in_flight_cap += 1
            return None
        self._pulls[item.key] = holder.peer.peer_id
        address = holder.peer.address
        return {"metadata": {}, "peer_host": address.host, "peer_port": address.port, "size_bytes": size}

    def _note_started(self, synthesized: Mapping[str, object]) -> None:
        """A pull whose reservation exists has started, and its entry is a copy (the peer keeps
        its own, so this one goes first when space is needed); one without did not (region full,
        or the item fell back recently): forget it here without blaming the peer's record."""
        for key in synthesized:
            if self._tier.holds(key):
                self._tier.mark_copy(key)
                self.stats.pulls_started += 1
            else:
                del self._pulls[key]
                self.stats.pulls_not_started += 1

    def _settle(self) -> None:
        """End the pulls whose fetch ended: READY is done; gone or quarantined failed, and the
        directory record that led to it is forgotten (stale, or its peer failing)."""
        for key, peer_id in list(self._pulls.items()):
            entry = self._tier.entry(key)
            if entry is not None and entry.phase is Phase.NOT_READY:
                continue
            del self._pulls[key]
            if entry is not None and entry.phase is Phase.READY:
                self.stats.pulls_done += 1
            else:
                self.stats.pulls_failed += 1
                self._updater.note_stale(peer_id, key)
