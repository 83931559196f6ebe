"""The fleet's feed subscriber: one ZMQ SUB per peer's event feed, on a thread of its own.

Driving adapter of fleet sharing (`application/fleet.py`): it reports to callbacks, which the
container points at `FleetUpdater` (`peer_seen`, `apply`, `peer_gone`, `tick`, `frame_rejected`).
A feed is configured with its peer (id and side channel: the static list), or alone: its peer
then introduces itself with hello frames (events.py), and until it has, its events are dropped
(counted in `unidentified`: there is no side channel to pull from).

- a connection to a configured peer's feed that completes its handshake: `on_seen(peer)` (boot
  not known); each hello on it: `on_seen(peer)` with the hello's boot (the configured id and side
  channel stay: a hello naming others is logged); every `tick_s` while it stays up,
  `on_seen(peer)` again (ZMTP heartbeats prove the peer alive even when it publishes nothing),
  then `on_tick()`;
- a feed configured alone: each hello names the peer (its engine id, `_dp<rank>` appended for a
  rank > 0, its side channel and boot): `on_seen(peer)`. A hello that claims the id of another
  feed's peer is refused (`rejected`); one naming another id than before ends the old peer;
- each event decoded from the peer's feed: `on_event(event, seq)`, the event's engine id
  replaced by the feed's peer id (data-parallel ranks of one engine publish one engine id on
  several feeds; the socket says which peer it is);
- a connection that ends (the peer closed it, or `heartbeat.timeout_s` passed without traffic
  after a PING: a stopped or partitioned peer): `on_gone(peer_id)` at once. ZMQ reconnects by
  itself; the next handshake (or hello) reports the peer seen again.

Frames that do not decode, or (with `secret`, the fleet's `side_channel_secret`) do not
authenticate, are dropped and counted (`rejected`, and `on_rejected()`); a callback that raises is
logged and never stops the thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import structlog
import zmq
from zmq.utils.monitor import recv_monitor_message

from ec_connector.domain.directory import Peer
from ec_connector.domain.publish import PeerAddress
from ec_connector.domain.transfers import CacheEvent

from .auth import FrameAuth
from .events import HELLO_TOPIC, TOPIC_PREFIX, EventFrameError, Hello, decode_event, decode_hello
from .sockets import Heartbeat

log = structlog.get_logger(__name__)

FEED_HEARTBEAT = Heartbeat(ivl_s=1.0, timeout_s=3.0, ttl_s=6.0)
_WATCHED = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
_MAX_BURST = 1024  # messages read from one socket before the others get a turn


@dataclass(frozen=True, slots=True)
class FeedPeer:
    """A peer of the fleet: who it is (id, side channel; None: told by its hello frames) and where
    its event feed is bound."""

    peer: Peer | None
    feed: str


@dataclass(slots=True)
class _Link:
    """One feed's state on the subscriber's thread: connected or not, and the peer it speaks for
    now (the configured one with the boot its hello told, or the one its hello introduced)."""

    member: FeedPeer
    up: bool = False
    peer: Peer | None = None
    warned: bool = False

    def reset(self) -> None:
        self.peer = self.member.peer  # boot unknown again until the next hello


class ZmqFleetFeed:
    """Subscribes to every peer's feed from one background thread; `start` once, `close` to stop."""

    def __init__(
        self,
        peers: Sequence[FeedPeer],
        *,
        on_seen: Callable[[Peer], object],
        on_event: Callable[[CacheEvent, int], object],
        on_gone: Callable[[str], object],
        on_tick: Callable[[], object],
        on_rejected: Callable[[], object] = lambda: None,
        tick_s: float = 1.0,
        heartbeat: Heartbeat = FEED_HEARTBEAT,
        secret: str | None = None,
    ) -> None:
        ids = [p.peer.peer_id for p in peers if p.peer is not None]
        if len(set(ids)) != len(ids):
            raise ValueError(f"fleet peers must have distinct ids, got {ids}")
        feeds = [p.feed for p in peers]
        if len(set(feeds)) != len(feeds):
            raise ValueError(f"fleet peers must have distinct feeds, got {feeds}")
        if not tick_s > 0:
            raise ValueError(f"tick_s must be > 0, got {tick_s}")
        self._peers = list(peers)
        self._on_seen, self._on_event, self._on_gone, self._on_tick = on_seen, on_event, on_gone, on_tick
        self._on_rejected = on_rejected
        self._tick_s = tick_s
        self._heartbeat = heartbeat
        self._auth = FrameAuth(secret) if secret else None  # used by the feed's thread alone
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.received = 0
        self.rejected = 0
        self.hellos = 0
        self.unidentified = 0

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the fleet feed is already started")
        self._thread = threading.Thread(target=self._run, name="ec-fleet-feed", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop and close every socket; idempotent; blocks until the thread ends."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        ctx = zmq.Context(io_threads=1)
        subs: dict[Any, _Link] = {}
        monitors: dict[Any, _Link] = {}
        links = [_Link(member, peer=member.peer) for member in self._peers]
        poller = zmq.Poller()
        try:
            for link in links:
                sock = ctx.socket(zmq.SUB)
                sock.setsockopt(zmq.LINGER, 0)
                self._heartbeat.apply(sock)
                sock.setsockopt(zmq.SUBSCRIBE, TOPIC_PREFIX)
                sock.setsockopt(zmq.SUBSCRIBE, HELLO_TOPIC)
                monitor = sock.get_monitor_socket(_WATCHED)
                sock.connect(link.member.feed)
                subs[sock], monitors[monitor] = link, link
                poller.register(sock, zmq.POLLIN)
                poller.register(monitor, zmq.POLLIN)
            next_tick = 0.0
            wait_ms = max(1, min(100, round(self._tick_s * 1000)))
            while not self._stop.is_set():
                for sock, _ in poller.poll(wait_ms):
                    if sock in subs:
                        self._read(sock, subs[sock], links)
                    else:
                        self._watch(sock, monitors[sock])
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + self._tick_s
                    for link in links:
                        if link.up and link.peer is not None:
                            self._call(self._on_seen, link.peer)
                    self._call(self._on_tick)
        finally:
            for sock in subs:
                sock.disable_monitor()
            for sock in (*subs, *monitors):
                sock.close(linger=0)
            ctx.term()

    def _read(self, sock: Any, link: _Link, links: list[_Link]) -> None:
        for _ in range(_MAX_BURST):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                if len(frames) > 1 and frames[0] == HELLO_TOPIC:
                    self._hello(link, decode_hello(frames, self._auth), links)
                    continue
                event = decode_event(frames, self._auth)
            except EventFrameError as err:
                self._reject(link, str(err))
                continue
            self.received += 1
            if link.peer is None:
                self.unidentified += 1
                continue
            cache_event = CacheEvent(event.kind, event.mm_hash, link.peer.peer_id, event.size_bytes)
            self._call(self._on_event, cache_event, event.seq)

    def _hello(self, link: _Link, hello: Hello, links: list[_Link]) -> None:
        """`link`'s publisher said who it is: the peer it speaks for now, reported seen."""
        self.hellos += 1
        link.up = True  # a hello may be read before the handshake's monitor event
        configured = link.member.peer
        if configured is not None:
            said = Peer(hello.engine_id, PeerAddress(hello.peer_host, hello.peer_port))
            if not link.warned and (said.peer_id, said.address) != (configured.peer_id, configured.address):
                link.warned = True
                log.warning(
                    "fleet_feed_hello_differs",
                    feed=link.member.feed,
                    configured=f"{configured.peer_id}@{configured.address.host}:{configured.address.port}",
                    hello=f"{said.peer_id}@{said.address.host}:{said.address.port}",
                )
            link.peer = replace(configured, boot=hello.boot)
        else:
            peer_id = hello.engine_id if hello.dp_rank == 0 else f"{hello.engine_id}_dp{hello.dp_rank}"
            taken = {other.peer.peer_id for other in links if other is not link and other.peer is not None}
            if peer_id in taken:
                self._reject(link, f"hello claims peer id {peer_id!r}, which another feed's peer has")
                return
            if link.peer is not None and link.peer.peer_id != peer_id:
                self._call(self._on_gone, link.peer.peer_id)
            link.peer = Peer(peer_id, PeerAddress(hello.peer_host, hello.peer_port), hello.boot)
        self._call(self._on_seen, link.peer)

    def _reject(self, link: _Link, reason: str) -> None:
        self.rejected += 1
        self._call(self._on_rejected)
        if self.rejected & (self.rejected - 1) == 0:  # the 1st, 2nd, 4th... only
            log.warning("fleet_feed_frame_dropped", feed=link.member.feed, reason=reason)

    def _watch(self, monitor: Any, link: _Link) -> None:
        while monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            event = recv_monitor_message(monitor, zmq.NOBLOCK)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED and not link.up:
                link.up = True
                link.reset()
                if link.peer is not None:
                    self._call(self._on_seen, link.peer)
            elif event == zmq.EVENT_DISCONNECTED and link.up:
                link.up = False
                if link.peer is not None:
                    self._call(self._on_gone, link.peer.peer_id)
                link.reset()

    def _call(self, fn: Callable[..., object], *args: object) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("fleet_feed_callback_failed", callback=getattr(fn, "__name__", repr(fn)))
