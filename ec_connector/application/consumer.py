"""The consumer side of P2P: pull announced encodings from producers, or fall back.

For each item a request names in `ec_transfer_params` and that is not in the local tier, the
fetcher reserves local blocks, asks the producer (XferReq), and on an OK ack READs the bytes into
those blocks; the entry then becomes READY and the item loads from the local tier as usual.

Every path ends within a bound: an ack not received within `consumer_ack_timeout_s`, a READ not
done within `read_timeout_s` (or whose producer's control connection is lost first: heartbeats),
or NACK_NOT_READY for longer than `not_ready_give_up_s` fall back to local encoding.
NACK_NOT_READY keeps the reservation (retried with backoff); a READ given up on leaves its blocks
quarantined, since a DMA may still write them. A request whose media were
rewritten away and whose item cannot be fetched is reported by `take_unavailable`.

Each fetch ends with exactly one INFO line, `peer_transfer`, whatever its outcome: `read` (the
bytes are here), `fallback` (encode locally; `reason` says why) or `unavailable` (a request
waiting for it has no media to encode: it is failed). It carries the item, the request that
started the fetch, the peer, bytes, runs, XferReqs sent, and ack/read/total milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import structlog

from ec_connector.application.scheduler import TierScheduler
from ec_connector.application.stats import PeerStats
from ec_connector.domain.config import ConnectorConfig
from ec_connector.domain.errors import ProtocolError
from ec_connector.domain.protocol import PROTOCOL_VERSION, NextStep, XferAck, XferDone, XferReq, next_step
from ec_connector.domain.publish import PeerAddress, PeerRef, parse_transfer_params
from ec_connector.logging import log_context
from ec_connector.ports.control import ControlClient
from ec_connector.ports.peer import PeerTransport, ReadState
from ec_connector.ports.runtime import Clock

log = structlog.get_logger(__name__)

FALLBACK_MEMORY_S = 60.0
"""An item whose pull a peer failed is not pulled again for this long: the request encodes it, and
the same peer would most likely fail it again. A pull this region had no room for is not
remembered: the next request for the item may find room."""

_LANDING_POLL_S = 0.001
"""How often `await_landed` looks at READs in flight: a READ's completion has no event to wait on,
a pull lands in about a millisecond, and the control client's waits are whole milliseconds."""


@dataclass(frozen=True, slots=True)
class WantedItem:
    """One multimodal item of a request: its identifier, rows, and whether its media is present."""

    key: str
    rows: int
    has_media: bool = True


class _State(Enum):
    ASKING = "asking"
    BACKING_OFF = "backing_off"
    READING = "reading"


@dataclass(slots=True)
class _Fetch:
    ref: PeerRef
    rows: int
    state: _State
    deadline: float
    give_up_at: float
    backoff: float
    started: float
    request_id: str = ""
    handle: int | None = None
    grant_id: int = 0
    asked: int = 0
    acked: float | None = None
    runs: int = 0
    read_started: float | None = None
    waiting_without_media: set[str] = field(default_factory=set)


class ConsumerFetcher:
    """Pulls items named by producers' params into the local tier."""

    def __init__(
        self,
        *,
        tier: TierScheduler,
        config: ConnectorConfig,
        clock: Clock,
        control: ControlClient,
        transport: PeerTransport,
        fingerprint: str,
        engine_id: str,
        stats: PeerStats,
    ) -> None:
        self._tier = tier
        self._config = config
        self._clock = clock
        self._control = control
        self._transport = transport
        self._fingerprint = fingerprint
        self._engine_id = engine_id
        self._fetches: dict[str, _Fetch] = {}
        self._agents: dict[PeerAddress, str] = {}  # the agent each producer last acked with
        self._fell_back: dict[str, float] = {}
        self._unavailable: set[str] = set()
        self._asked: set[str] = set()  # fetches asked since the last await_acks, still in flight
        self.stats = stats

    def ensure_available(self, request_id: str, params: object, items: Sequence[WantedItem]) -> bool:
        """True when no item of the request is still being fetched (deferred while False)."""
        refs = self._refs(request_id, params) if params else {}
        pending = False
        now = self._clock.now()
        for item in items:
            if self._tier.is_ready(item.key):
                if not item.has_media:  # nothing could encode it if it were evicted now
                    self._tier.promise(item.key)
                continue
            fetch = self._fetches.get(item.key)
            if fetch is not None:
                if not item.has_media:
                    fetch.waiting_without_media.add(request_id)
                pending = True
                continue
            ref = refs.get(item.key)
            if (
                ref is not None
                and item.key not in self._fell_back
                and self._start(ref, item, now, request_id)
            ):
                if not item.has_media:
                    self._fetches[item.key].waiting_without_media.add(request_id)
                pending = True
            elif not item.has_media:
                # Nothing here can encode it: keep the request unscheduled until
                # take_unavailable fails it (scheduled, it would reach the encoder empty).
                self._unavailable.add(request_id)
                pending = True
        return not pending

    def recheck(self, request_id: str, items: Sequence[WantedItem]) -> bool:
        """`ensure_available` again for a request it was just asked about, once its pulls had time
        to land: the same answer from the fetches as they stand, with no params, so nothing new
        is started."""
        return self.ensure_available(request_id, None, items)

    def poll(self) -> None:
        """Apply acks and peer losses, progress READs, enforce every deadline; non-blocking."""
        replies = self._control.poll()
        now = self._clock.now()
        for reply in replies:
            if reply.ack is None:
                self._peer_lost(reply.address)
            else:
                fetch = self._fetches.get(reply.ack.mm_hash)
                with self._bound(reply.ack.mm_hash, fetch):
                    self._on_ack(reply.address, reply.ack, now)
        for key, fetch in list(self._fetches.items()):
            self._progress(key, fetch, now)  # its lines name the fetch themselves
        horizon = now - FALLBACK_MEMORY_S
        self._fell_back = {k: t for k, t in self._fell_back.items() if t > horizon}

    def has_pending_work(self) -> bool:
        return bool(self._fetches)

    def await_acks(self, budget_s: float) -> None:
        """Wait up to `budget_s` for the acks of the asks sent since the last call, handling each
        reply as it comes (an OK ack posts its READ); then those asks are forgotten here.

        Called at the end of an engine step: a producer acks within a millisecond, which the rest
        of the step's scheduling may not last, and an ack handled now has its READ land during the
        forward, so the request is scheduled at the next step instead of the one after. Only this
        step's asks are waited for, so a silent producer costs each step at most `budget_s` until
        its asks time out."""
        asked, self._asked = self._asked, set()
        if budget_s <= 0 or not asked:
            return
        deadline = self._clock.now() + budget_s
        while any(self._awaits_ack(key) for key in asked):
            left = deadline - self._clock.now()
            if left <= 0 or not self._control.wait(left):
                return
            self.poll()

    def await_landed(self, budget_s: float) -> float:
        """Wait up to `budget_s` for the READs in flight and this step's asks to land or end
        otherwise, handling acks and READ completions as they come; returns the seconds it waited.

        Called while the step is scheduled, right after a request's pulls were asked for: a pull
        from a peer nearby lands in a millisecond or two, and one that lands now lets vLLM schedule
        its request in this step rather than the next. Asks of earlier steps still unanswered and
        pulls backing off after NACK_NOT_READY are not waited for: their answers come later than
        any such budget, and waiting on them would cost every step."""
        started = self._clock.now()
        if budget_s <= 0:
            return 0.0
        deadline = started + budget_s
        # Bounded in rounds as well as in time, so a wait that returns at once cannot spin.
        for _ in range(int(budget_s / _LANDING_POLL_S) + 2):
            self.poll()
            if not self._landing():
                break
            left = deadline - self._clock.now()
            if left <= 0:
                break
            self._control.wait(min(left, _LANDING_POLL_S))  # an ack, a loss, or time to look at READs
        return self._clock.now() - started

    def _landing(self) -> bool:
        """Whether a READ is in flight or an ask of this step awaits its ack."""
        return any(
            fetch.state is _State.READING or (fetch.state is _State.ASKING and key in self._asked)
            for key, fetch in self._fetches.items()
        )

    def _awaits_ack(self, key: str) -> bool:
        fetch = self._fetches.get(key)
        return fetch is not None and fetch.state is _State.ASKING

    def take_unavailable(self) -> set[str]:
        """Requests whose media are gone and whose items could not be fetched (fail them)."""
        out, self._unavailable = self._unavailable, set()
        self.stats.unavailable_requests += len(out)
        return out

    def _refs(self, request_id: str, params: object) -> dict[str, PeerRef | None]:
        try:
            return parse_transfer_params(params)
        except ProtocolError as err:
            self.stats.bad_params += 1
            log.warning("transfer_params_rejected", request_id=request_id, reason=str(err))
            return {}

    def _bound(self, key: str, fetch: _Fetch | None, request_id: str | None = None) -> Any:
        """Log context of one fetch: every line logged inside names the item, request and peer."""
        context: dict[str, object] = {"role": self._config.role.value, "engine_id": self._engine_id}
        context["mm_hash"] = key
        if fetch is not None:
            context["request_id"] = fetch.request_id
            context["peer"] = _peer(fetch.ref)
        elif request_id is not None:
            context["request_id"] = request_id
        return log_context(**context)

    def _start(self, ref: PeerRef, item: WantedItem, now: float, request_id: str) -> bool:
        with self._bound(item.key, None, request_id):
            layout = self._tier.layout
            if ref.size_bytes != item.rows * layout.block_size_bytes:
                self.stats.bad_params += 1
                log.warning("transfer_size_mismatch", size=ref.size_bytes, rows=item.rows, peer=_peer(ref))
                return False
            if self._tier.holds(item.key):
                return False  # a local save of the same item is in flight
            lease = self._config.consumer_ack_timeout_s + self._config.not_ready_give_up_s
            reservation = self._tier.reserve_fetch(
                item.key, item.rows, now=now, lease_s=lease + self._config.read_timeout_s
            )
            fetch = _Fetch(
                ref=ref,
                rows=item.rows,
                state=_State.ASKING,
                deadline=now + self._config.consumer_ack_timeout_s,
                give_up_at=now + self._config.not_ready_give_up_s,
                backoff=self._config.not_ready_backoff_s,
                started=now,
                request_id=request_id,
                waiting_without_media=set() if item.has_media else {request_id},
            )
            if reservation is None:
                self.stats.fallbacks += 1  # not remembered: the region's room, not the peer, refused
                self._log_transfer(item.key, fetch, now, "region_full")
                return False
            self._fetches[item.key] = fetch
            self._ask(fetch)
            return True

    def _ask(self, fetch: _Fetch) -> None:
        req = XferReq(PROTOCOL_VERSION, fetch.ref.mm_hash, self._fingerprint, self._engine_id)
        self._control.send(fetch.ref.address, req)
        self._asked.add(req.mm_hash)
        fetch.asked += 1
        self.stats.requests_sent += 1

    def _on_ack(self, address: PeerAddress, ack: XferAck, now: float) -> None:
        fetch = self._fetches.get(ack.mm_hash)
        if fetch is None or fetch.state is not _State.ASKING or fetch.ref.address != address:
            self.stats.late_acks += 1
            if ack.grant_id:
                self._control.send(address, XferDone(PROTOCOL_VERSION, ack.mm_hash, ack.grant_id))
            return
        fetch.acked = now
        step = next_step(ack.status)
        if step is NextStep.FALLBACK:
            self.stats.count_nack(ack.status.value)
            self._fail(ack.mm_hash, fetch, now, ack.status.value)
        elif step is NextStep.RETRY:
            self.stats.count_nack(ack.status.value)
            if now >= fetch.give_up_at:
                self._fail(ack.mm_hash, fetch, now, "not_ready_too_long")
                return
            fetch.state, fetch.deadline = _State.BACKING_OFF, now + fetch.backoff
            fetch.backoff = min(fetch.backoff * 2, self._config.not_ready_backoff_max_s)
        else:
            self.stats.acks_ok += 1
            fetch.grant_id = ack.grant_id
            self._read(ack, fetch, now)

    def _read(self, ack: XferAck, fetch: _Fetch, now: float) -> None:
        entry = self._tier.entry(ack.mm_hash)
        size = fetch.rows * self._tier.layout.block_size_bytes
        if (
            entry is None
            or ack.size_bytes != size
            or sum(n for _, n in ack.runs) != size
            or not ack.agent_name
        ):
            self.stats.bad_acks += 1
            self._fail(ack.mm_hash, fetch, now, "bad_ack")
            return
        try:
            self._use_agent(fetch.ref.address, ack.agent_name)
            self._transport.add_peer(ack.agent_name, ack.agent_metadata)
            fetch.handle = self._transport.start_read(
                ack.agent_name, ack.runs, self._tier.layout.byte_runs(entry.extents)
            )
        except (ConnectionError, ValueError) as err:
            log.warning("peer_read_not_started", agent=ack.agent_name, reason=str(err))
            self.stats.reads_failed += 1
            self._fail(ack.mm_hash, fetch, now, "read_not_started")
            return
        fetch.state, fetch.deadline = _State.READING, now + self._config.read_timeout_s
        fetch.read_started, fetch.runs = now, len(ack.runs)

    def _use_agent(self, address: PeerAddress, agent: str) -> None:
        """Note the agent `address` acked with. A new one means its producer restarted (each
        start names its agent anew): the old agent is removed, so dead agents do not pile up and
        no agent name is ever loaded twice (NIXL 1.5.1 aborted ~1 run in 50 reading a producer
        re-added under its old name; docs/reliability.md)."""
        old = self._agents.get(address)
        if old == agent:
            return
        self._agents[address] = agent
        if old is not None:
            self._transport.remove_peer(old)
            self.stats.agents_replaced += 1
            log.info("peer_agent_replaced", peer=f"{address.host}:{address.port}", old=old, new=agent)

    def _progress(self, key: str, fetch: _Fetch, now: float) -> None:
        if fetch.state is _State.ASKING and now >= fetch.deadline:
            self.stats.ack_timeouts += 1
            self._fail(key, fetch, now, "ack_timeout")
        elif fetch.state is _State.BACKING_OFF and now >= fetch.deadline:
            fetch.state, fetch.deadline = _State.ASKING, now + self._config.consumer_ack_timeout_s
            self._ask(fetch)
        elif fetch.state is _State.READING:
            assert fetch.handle is not None
            state = self._transport.read_state(fetch.handle)
            if state is ReadState.DONE:
                self._transport.release(fetch.handle)
                self._done(key, fetch, now)
            elif state is ReadState.FAILED:
                self._transport.release(fetch.handle)
                self.stats.reads_failed += 1
                self._fail(key, fetch, now, "read_failed", quarantine=True)
            elif now >= fetch.deadline:
                self._transport.release(fetch.handle)
                self.stats.read_timeouts += 1
                self._fail(key, fetch, now, "read_timeout", quarantine=True)

    def _done(self, key: str, fetch: _Fetch, now: float) -> None:
        del self._fetches[key]
        self._asked.discard(key)
        # First the message the producer waits on to unpin; then the bookkeeping (the entry turns
        # READY and its STORED event goes out on this thread, before any lookup can see it).
        self._control.send(fetch.ref.address, XferDone(PROTOCOL_VERSION, key, fetch.grant_id))
        self._tier.finish_fetch(key)
        self.stats.reads_done += 1
        self.stats.bytes_read += fetch.ref.size_bytes
        self.stats.latencies.observe("peer_read", now - (fetch.read_started or now))
        self.stats.latencies.observe("peer_fetch", now - fetch.started)
        self._log_transfer(key, fetch, now)

    def _peer_lost(self, address: PeerAddress) -> None:
        """The control connection to a producer went down (closed, or heartbeats unanswered).

        Its fetches fall back now rather than at their deadlines. A READ already posted is given
        up as a read timeout is (its blocks quarantined, a DMA may still land): a stopped or
        partitioned producer then costs the heartbeat timeout, not the whole `read_timeout_s`.
        """
        now = self._clock.now()
        for key, fetch in list(self._fetches.items()):
            if fetch.ref.address != address:
                continue
            with self._bound(key, fetch):
                if fetch.state is _State.READING:
                    self._progress(key, fetch, now)  # a READ that ended before the link went counts
                    if key not in self._fetches:
                        continue
                    assert fetch.handle is not None
                    self._transport.release(fetch.handle)
                self.stats.peers_lost += 1
                self._fail(key, fetch, now, "peer_lost", quarantine=fetch.state is _State.READING)

    def _fail(self, key: str, fetch: _Fetch, now: float, reason: str, *, quarantine: bool = False) -> None:
        del self._fetches[key]
        self._asked.discard(key)
        quarantine_s = self._config.quarantine_s if quarantine else None
        if self._tier.fail_fetch(key, now=now, quarantine_s=quarantine_s):
            self.stats.quarantines += 1
        if fetch.grant_id and reason != "read_not_started":
            self._control.send(fetch.ref.address, XferDone(PROTOCOL_VERSION, key, fetch.grant_id))
        self._unavailable |= fetch.waiting_without_media
        self._fall_back(key, now, reason)
        self._log_transfer(key, fetch, now, reason)

    def _log_transfer(self, key: str, fetch: _Fetch, now: float, reason: str | None = None) -> None:
        """The one canonical line of a fetch: read (no reason), else fallback or unavailable."""
        outcome = "unavailable" if fetch.waiting_without_media else "fallback"
        outcome = "read" if reason is None else outcome
        fields = {
            "role": self._config.role.value,
            "engine_id": self._engine_id,
            "mm_hash": key,
            "request_id": fetch.request_id,
            "peer": _peer(fetch.ref),
            "outcome": outcome,
            "reason": reason,
            "bytes": fetch.ref.size_bytes,
            "runs": fetch.runs,
            "asked": fetch.asked,
            "ack_ms": _ms(fetch.acked - fetch.started) if fetch.acked is not None else None,
            "read_ms": _ms(now - fetch.read_started) if fetch.read_started is not None else None,
            "total_ms": _ms(now - fetch.started),
            "failed_requests": sorted(fetch.waiting_without_media) if outcome == "unavailable" else None,
        }
        log.info("peer_transfer", **{k: v for k, v in fields.items() if v is not None})

    def _fall_back(self, key: str, now: float, reason: str) -> None:
        self._fell_back[key] = now
        self.stats.fallbacks += 1


def _peer(ref: PeerRef) -> str:
    return f"{ref.address.host}:{ref.address.port}"


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)
