"""The fleet's feed subscriber: one ZMQ SUB per peer's event feed, on a thread of its own.

Driving adapter of fleet sharing (`application/fleet.py`): it reports to callbacks, which the
container points at `FleetUpdater` (`peer_seen`, `apply`, `peer_gone`, `tick`):

- a connection to a peer's feed that completes its handshake: `on_seen(peer)`; every `tick_s`
  while it stays up, `on_seen(peer)` again (ZMTP heartbeats prove the peer alive even when it
  publishes nothing), then `on_tick()`;
- each event decoded from the peer's feed: `on_event(event, seq)`, the event's engine id
  replaced by the configured peer id (data-parallel ranks of one engine publish one engine id on
  several feeds; the socket says which peer it is);
- a connection that ends (the peer closed it, or `heartbeat.timeout_s` passed without traffic
  after a PING: a stopped or partitioned peer): `on_gone(peer_id)` at once. ZMQ reconnects by
  itself; the next handshake reports the peer seen again.

Frames that do not decode, or (with `secret`, the fleet's `side_channel_secret`) do not
authenticate, are dropped and counted (`rejected`); a callback that raises is logged and never
stops the thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
import zmq
from zmq.utils.monitor import recv_monitor_message

from ec_connector.domain.directory import Peer
from ec_connector.domain.transfers import CacheEvent

from .auth import FrameAuth
from .events import TOPIC_PREFIX, EventFrameError, decode_event
from .sockets import Heartbeat

log = structlog.get_logger(__name__)

FEED_HEARTBEAT = Heartbeat(ivl_s=1.0, timeout_s=3.0, ttl_s=6.0)
_WATCHED = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
_MAX_BURST = 1024  # messages read from one socket before the others get a turn


@dataclass(frozen=True, slots=True)
class FeedPeer:
    """A peer of the fleet: who it is (id, side channel) and where its event feed is bound."""

    peer: Peer
    feed: str


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
        tick_s: float = 1.0,
        heartbeat: Heartbeat = FEED_HEARTBEAT,
        secret: str | None = None,
    ) -> None:
        ids = [p.peer.peer_id for p in peers]
        if len(set(ids)) != len(ids):
            raise ValueError(f"fleet peers must have distinct ids, got {ids}")
        if not tick_s > 0:
            raise ValueError(f"tick_s must be > 0, got {tick_s}")
        self._peers = list(peers)
        self._on_seen, self._on_event, self._on_gone, self._on_tick = on_seen, on_event, on_gone, on_tick
        self._tick_s = tick_s
        self._heartbeat = heartbeat
        self._auth = FrameAuth(secret) if secret else None  # used by the feed's thread alone
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.received = 0
        self.rejected = 0

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
        subs: dict[Any, FeedPeer] = {}
        monitors: dict[Any, FeedPeer] = {}
        up: set[str] = set()
        poller = zmq.Poller()
        try:
            for member in self._peers:
                sock = ctx.socket(zmq.SUB)
                sock.setsockopt(zmq.LINGER, 0)
                self._heartbeat.apply(sock)
                sock.setsockopt(zmq.SUBSCRIBE, TOPIC_PREFIX)
                monitor = sock.get_monitor_socket(_WATCHED)
                sock.connect(member.feed)
                subs[sock], monitors[monitor] = member, member
                poller.register(sock, zmq.POLLIN)
                poller.register(monitor, zmq.POLLIN)
            next_tick = 0.0
            wait_ms = max(1, min(100, round(self._tick_s * 1000)))
            while not self._stop.is_set():
                for sock, _ in poller.poll(wait_ms):
                    if sock in subs:
                        self._read(sock, subs[sock])
                    else:
                        self._watch(sock, monitors[sock], up)
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + self._tick_s
                    for member in self._peers:
                        if member.peer.peer_id in up:
                            self._call(self._on_seen, member.peer)
                    self._call(self._on_tick)
        finally:
            for sock in subs:
                sock.disable_monitor()
            for sock in (*subs, *monitors):
                sock.close(linger=0)
            ctx.term()

    def _read(self, sock: Any, member: FeedPeer) -> None:
        for _ in range(_MAX_BURST):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                event = decode_event(frames, self._auth)
            except EventFrameError as err:
                self.rejected += 1
                if self.rejected & (self.rejected - 1) == 0:  # the 1st, 2nd, 4th... only
                    log.warning("fleet_feed_frame_dropped", peer=member.peer.peer_id, reason=str(err))
                continue
            self.received += 1
            cache_event = CacheEvent(event.kind, event.mm_hash, member.peer.peer_id, event.size_bytes)
            self._call(self._on_event, cache_event, event.seq)

    def _watch(self, monitor: Any, member: FeedPeer, up: set[str]) -> None:
        while monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            event = recv_monitor_message(monitor, zmq.NOBLOCK)["event"]
            peer_id = member.peer.peer_id
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                up.add(peer_id)
                self._call(self._on_seen, member.peer)
            elif event == zmq.EVENT_DISCONNECTED and peer_id in up:
                up.discard(peer_id)
                self._call(self._on_gone, peer_id)

    def _call(self, fn: Callable[..., object], *args: object) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("fleet_feed_callback_failed", callback=getattr(fn, "__name__", repr(fn)))
