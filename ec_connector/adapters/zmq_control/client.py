"""The consumer's side channel: one ZMQ DEALER per producer, driven from one thread.

No thread of its own: `send` and `poll` are non-blocking calls from the engine's scheduler thread,
which owns every socket (ZMQ sockets are not thread-safe). Each DEALER is made on the first send
to its address and watched by a socket monitor; `poll` drains acks first, then the monitor, so an
ack that arrived is never lost behind the news that its peer is gone.

A peer is reported lost, once, as `Reply(address, None)`, when its connection drops (the peer
closed, or ZMTP heartbeats went unanswered for `heartbeat.timeout_s`), when a connection attempt is
refused or fails its handshake, when no connection is made within `connect_timeout_s`, or when its
send queue is full. The DEALER is then closed with whatever it still queued; the application treats
every request in flight to that peer as failed, and the next send opens a fresh connection, so a
restarted producer on the same address is reached again.

ZMQ_IMMEDIATE is 0 on purpose: with one endpoint per socket and sockets discarded on loss, queueing
to a connection still being made is what lets the very first request leave without waiting for a
poll; IMMEDIATE=1 would refuse that send (EAGAIN) until the handshake ends.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import structlog
import zmq
from zmq.utils.monitor import recv_monitor_message

from ec_connector.domain.protocol import AckStatus, XferAck, XferDone, XferReq
from ec_connector.domain.publish import PeerAddress
from ec_connector.ports.control import Reply

from .auth import ACK, DEFAULT_WINDOW_S, REQUEST, FrameAuth, seal, unseal
from .codec import FrameRejected, VersionMismatch, check_size, decode_ack, encode
from .sockets import DEFAULT_HEARTBEAT, DropCounter, Heartbeat, common_options, tcp_endpoint

log = structlog.get_logger(__name__)

_WATCHED = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CONNECT_RETRIED
    | zmq.EVENT_CLOSED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # plain ints: enum arithmetic costs µs per poll
_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


@dataclass
class _Peer:
    address: PeerAddress
    sock: zmq.Socket
    monitor: zmq.Socket
    opened: float
    up: bool = False


class ZmqControlClient:
    """The ControlClient port over ZMQ (driven adapter, consumer side); use from one thread only.

    `dropped` counts refused ack frames by reason, as the server's does.
    """

    def __init__(
        self,
        *,
        secret: bytes | str | None = None,
        heartbeat: Heartbeat = DEFAULT_HEARTBEAT,
        connect_timeout_s: float | None = None,
        hwm: int = 256,
        auth_window_s: float = DEFAULT_WINDOW_S,
    ) -> None:
        connect_timeout_s = heartbeat.timeout_s if connect_timeout_s is None else connect_timeout_s
        if not connect_timeout_s > 0 or hwm < 1:
            raise ValueError(f"connect_timeout_s must be > 0 and hwm >= 1, got {connect_timeout_s}, {hwm}")
        self._auth = None if secret is None else FrameAuth(secret, window_s=auth_window_s)
        self._heartbeat = heartbeat
        self._connect_timeout_s = connect_timeout_s
        self._hwm = hwm
        self._ctx: zmq.Context | None = None
        self._peers: dict[PeerAddress, _Peer] = {}
        self._pending: list[Reply] = []
        self._drops = DropCounter("client")
        self.dropped: dict[str, int] = self._drops.counts
        self._closed = False

    def send(self, address: PeerAddress, message: XferReq | XferDone) -> None:
        """Queue `message` for the producer at `address`; non-blocking.

        A message this end would refuse to encode raises FrameRejected (a caller bug); a peer that
        cannot take it is reported lost at the next poll.
        """
        if self._closed:
            raise RuntimeError("the control client is closed")
        payload = encode(message)
        peer = self._peers.get(address) or self._open(address)
        if peer is None:
            self._pending.append(Reply(address, None))
            return
        try:
            peer.sock.send_multipart(seal(self._auth, REQUEST, payload), zmq.NOBLOCK)
        except zmq.Again:
            self._receive(peer, self._pending)
            self._pending.append(self._lose(peer, f"send queue full ({self._hwm} messages)"))

    def poll(self) -> list[Reply]:
        """Replies and peer losses since the last poll; non-blocking; each returned once."""
        out, self._pending = self._pending, []
        now = time.monotonic()
        for peer in list(self._peers.values()):
            self._receive(peer, out)
            reason = self._watch(peer, now)
            if reason is not None:
                out.append(self._lose(peer, reason))
        return out

    def wait(self, timeout_s: float) -> bool:
        """Block up to `timeout_s` until an ack or monitor news may be ready for `poll`; False when
        the time ran out (rounded up to whole milliseconds) or no peer is connected. Reads nothing."""
        if self._pending:
            return True
        if not self._peers or timeout_s <= 0:
            return False
        poller = zmq.Poller()
        for peer in self._peers.values():
            poller.register(peer.sock, zmq.POLLIN)
            poller.register(peer.monitor, zmq.POLLIN)
        return bool(poller.poll(max(1, math.ceil(timeout_s * 1000.0))))  # whole milliseconds

    def close(self) -> None:
        """Drop every connection (linger 0); idempotent."""
        if self._closed:
            return
        self._closed = True
        for peer in self._peers.values():
            _close(peer)
        self._peers.clear()
        self._pending.clear()
        if self._ctx is not None:
            self._ctx.term()

    def _open(self, address: PeerAddress) -> _Peer | None:
        if self._ctx is None:
            self._ctx = zmq.Context(io_threads=1)
        endpoint, ipv6 = tcp_endpoint(address.host, address.port)
        sock = self._ctx.socket(zmq.DEALER)
        common_options(sock, ipv6=ipv6, hwm=self._hwm)
        sock.setsockopt(zmq.IMMEDIATE, 0)
        self._heartbeat.apply(sock)
        timeout_ms = max(1, round(self._connect_timeout_s * 1000))
        sock.setsockopt(zmq.CONNECT_TIMEOUT, timeout_ms)
        sock.setsockopt(zmq.HANDSHAKE_IVL, timeout_ms)
        monitor = sock.get_monitor_socket(_WATCHED)
        peer = _Peer(address, sock, monitor, time.monotonic())
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as err:
            log.warning(
                "control_peer_lost",
                host=address.host,
                port=address.port,
                reason=f"cannot connect to {endpoint}: {err.strerror}",
            )
            _close(peer)
            return None
        self._peers[address] = peer
        return peer

    def _receive(self, peer: _Peer, out: list[Reply]) -> None:
        for _ in range(self._hwm):  # bounded: a flooding peer cannot hold the scheduler thread
            if not peer.sock.getsockopt(_EVENTS) & _POLLIN:  # type: ignore[operator]  # an int option
                return  # asked first: cheaper than a recv that raises Again, on every poll
            parts = peer.sock.recv_multipart(zmq.NOBLOCK)
            try:
                check_size(len(parts[0]))
                ack = decode_ack(unseal(self._auth, ACK, parts))
            except VersionMismatch as err:
                if err.kind in ("req", "done"):
                    self._drops.drop(err.reason, err, host=peer.address.host, port=peer.address.port)
                    continue
                ack = XferAck(err.version, err.mm_hash, AckStatus.NACK_VERSION)
            except FrameRejected as err:
                self._drops.drop(err.reason, err, host=peer.address.host, port=peer.address.port)
                continue
            out.append(Reply(peer.address, ack))

    def _watch(self, peer: _Peer, now: float) -> str | None:
        """Why the peer is lost, reading its monitor's news; None while it is (or may get) up."""
        while peer.monitor.getsockopt(_EVENTS) & _POLLIN:  # type: ignore[operator]  # an int option
            event = recv_monitor_message(peer.monitor, zmq.NOBLOCK)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                peer.up = True
            elif event == zmq.EVENT_DISCONNECTED:
                return "disconnected (peer closed, or heartbeats went unanswered)"
            elif event & _HANDSHAKE_FAILED:
                return "handshake failed (not a ZMTP peer of this protocol)"
            elif not peer.up:  # CONNECT_RETRIED or CLOSED before any connection: refused
                return "connection refused"
        if not peer.up and now - peer.opened > self._connect_timeout_s:
            return f"no connection within {self._connect_timeout_s:g} s"
        return None

    def _lose(self, peer: _Peer, reason: str) -> Reply:
        log.warning("control_peer_lost", host=peer.address.host, port=peer.address.port, reason=reason)
        del self._peers[peer.address]
        _close(peer)
        return Reply(peer.address, None)


def _close(peer: _Peer) -> None:
    peer.sock.disable_monitor()
    peer.monitor.close(linger=0)
    peer.sock.close(linger=0)
