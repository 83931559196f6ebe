"""The producer's side channel: a ZMQ ROUTER answered from its own I/O thread.

The thread owns the socket once `start` runs: it reads each request, calls the application's
thread-safe callback and sends the ack straight back to that peer, so ack latency never waits for
an engine step. One thread serves every peer in arrival order; `on_request` must therefore be a
quick lookup (the producer desk's is a table read under a lock), never a wait on the engine.

An ask answered NACK_NOT_READY (the entry's save has not landed) is held instead, and asked of
`on_request` again at doubling gaps from 1 to 4 ms, for up to `not_ready_hold_s`: answered as soon
as the save is seen, or NACK_NOT_READY when the hold ends. Consumers ask before the producer has
seen a save land; held, their ask is granted then rather than retried on a later engine step.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
import zmq

from ec_connector.domain.errors import ECConnectorError
from ec_connector.domain.protocol import PROTOCOL_VERSION, AckStatus, XferAck, XferDone, XferReq
from ec_connector.domain.publish import PeerAddress

from .auth import ACK, DEFAULT_WINDOW_S, REQUEST, FrameAuth, seal, unseal
from .codec import FrameRejected, VersionMismatch, check_size, decode_request, encode
from .sockets import DEFAULT_HEARTBEAT, DropCounter, Heartbeat, common_options, tcp_endpoint

log = structlog.get_logger(__name__)

_BATCH = 256  # messages handled per wake-up before the stop flag is looked at again
IDLE_TICK_MS = 1
"""The I/O thread wakes at least this often while no request comes. A thread that slept long
(and the core under it) answers the first request after a pause much later than one that was
just awake: on the GPU machine's 16-core host a round trip of our client and server after 10 ms
idle took 646 µs with the thread blocked in poll, 458 µs with this tick. The cost, ~1000 empty
wake-ups a second, is small beside NIXL's progress thread, which spins a whole core in the same
producer."""
NOT_READY_HOLD_S = 0.25
"""Default hold of an ask whose entry is still saving. A consumer asks as soon as the producer
publishes, which can be before the save's copy has run on the busy producer GPU and been reported
by its worker: on the H200 E->PD bench a 10 ms hold still left 129 of 435 asks answered
NACK_NOT_READY, each retry then costing the consumer another engine step (146 ms p50 with one
retry, 296 ms with two). A hold of a few producer steps (50-150 ms each there) answers nearly
every ask with its grant; it stays well under the consumer's `consumer_ack_timeout_s` (2 s by
default), which must stay above it."""


_REASK_FIRST_S = 0.001
_REASK_MAX_S = 0.004
"""A held ask is asked again after 1 ms, then at doubling gaps up to 4 ms: a grant follows the save's
landing within 4 ms, and an ask held the whole hold costs the scheduler's lock about 65 lookups
rather than one each millisecond."""


@dataclass(slots=True)
class _Held:
    """An ask answered NACK_NOT_READY, held: its peer, the ask, the hold's end, when it is asked
    again, and the gap before that (both moved on at each ask, by the I/O thread alone)."""

    peer: bytes
    req: XferReq
    until: float
    next_at: float
    gap: float


class ControlBindError(ECConnectorError, OSError):
    """The side channel cannot listen at the configured address: choose a free one and restart."""


class ZmqControlServer:
    """The ControlServer port over ZMQ (driven adapter, producer side).

    Binds at construction, so a taken port fails before the engine starts serving. `dropped`
    counts refused frames by reason (malformed, oversized, auth, version, unexpected; `unsent`
    for acks the peer could no longer take); the I/O thread never dies of a frame.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        secret: bytes | str | None = None,
        heartbeat: Heartbeat = DEFAULT_HEARTBEAT,
        auth_window_s: float = DEFAULT_WINDOW_S,
        hwm: int = 1000,
        join_timeout_s: float = 5.0,
        not_ready_hold_s: float = NOT_READY_HOLD_S,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"side-channel port {port} is outside 0-65535 (0 picks a free port)")
        self._auth = None if secret is None else FrameAuth(secret, window_s=auth_window_s)
        self._join_timeout_s = join_timeout_s
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._bind(host, port, heartbeat, hwm)
        bound = int(self._sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
        self.address = PeerAddress(host, bound)
        self._drops = DropCounter("server")
        self.dropped: dict[str, int] = self._drops.counts
        self.answered = 0
        self.done = 0
        self.callback_errors = 0
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._on_request: Callable[[XferReq], XferAck] | None = None
        self._on_done: Callable[[XferDone], None] | None = None
        self._hold_s = not_ready_hold_s
        self._held: list[_Held] = []  # I/O thread only

    def start(
        self,
        on_request: Callable[[XferReq], XferAck],
        on_done: Callable[[XferDone], None],
    ) -> None:
        """Begin answering peers from a background thread; the callbacks must be thread-safe."""
        with self._lock:
            if self._closed or self._thread is not None:
                raise RuntimeError(f"control server at {self.address} is already started or closed")
            self._on_request, self._on_done = on_request, on_done
            self._thread = threading.Thread(target=self._serve, name="ec-control-server", daemon=True)
            self._thread.start()
        log.info(
            "control_server_started",
            host=self.address.host,
            port=self.address.port,
            auth=self._auth is not None,
        )

    def close(self) -> None:
        """Stop answering and release the socket; idempotent; waits up to join_timeout_s."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is None:
            self._release()
        else:
            self._stop.set()
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"\0")
            thread.join(self._join_timeout_s)
            if thread.is_alive():
                # The thread still holds the socket; it closes it itself when the callback returns.
                log.warning("control_server_stuck", port=self.address.port, timeout_s=self._join_timeout_s)
                return
        os.close(self._wake_r)
        os.close(self._wake_w)
        log.info("control_server_closed", port=self.address.port, dropped=dict(self.dropped))

    # -- the I/O thread --------------------------------------------------------------------------

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(IDLE_TICK_MS))
                if self._stop.is_set():
                    break
                if self._wake_r in ready:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                if self._sock in ready:
                    self._drain()
                if self._held:
                    self._answer_held()
        except zmq.ZMQError:
            log.exception("control_server_failed", port=self.address.port)
        finally:
            self._release()

    def _drain(self) -> None:
        for _ in range(_BATCH):
            try:
                parts = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self._handle(parts[0], parts[1:])
            except Exception as err:  # a bug here must cost one frame, never the channel
                log.exception("control_frame_failed", peer=parts[0].hex())
                self._drops.drop("malformed", err)

    def _handle(self, peer: bytes, frames: list[bytes]) -> None:
        try:
            if frames:
                check_size(len(frames[0]))
            message = decode_request(unseal(self._auth, REQUEST, frames))
        except VersionMismatch as err:
            if err.kind in ("ack", "done"):
                self._drops.drop(err.reason, err, peer=peer.hex())
                return
            log.info("control_version_refused", peer=peer.hex(), version=err.version, mm_hash=err.mm_hash)
            self._reply(peer, encode(XferAck(PROTOCOL_VERSION, err.mm_hash, AckStatus.NACK_VERSION)))
            return
        except FrameRejected as err:
            self._drops.drop(err.reason, err, peer=peer.hex())
            return
        if not isinstance(message, XferReq):
            self._finish(message)
            return
        ack = self._answer(message)
        if ack.status is AckStatus.NACK_NOT_READY and self._hold_s > 0:
            now = time.monotonic()
            self._held.append(_Held(peer, message, now + self._hold_s, now + _REASK_FIRST_S, _REASK_FIRST_S))
        else:
            self._reply(peer, self._encoded(message, ack))

    def _answer_held(self) -> None:
        """Ask again for each held ask that is due: reply once it is no longer NOT_READY or its
        hold ended; otherwise ask again after twice the last gap, at most _REASK_MAX_S."""
        now = time.monotonic()
        still: list[_Held] = []
        for held in self._held:
            if now < held.next_at and now < held.until:
                still.append(held)
                continue
            ack = self._answer(held.req)
            if ack.status is AckStatus.NACK_NOT_READY and now < held.until:
                held.gap = min(2 * held.gap, _REASK_MAX_S)
                held.next_at = now + held.gap
                still.append(held)
            else:
                self._reply(held.peer, self._encoded(held.req, ack))
        self._held = still

    def _answer(self, req: XferReq) -> XferAck:
        assert self._on_request is not None
        try:
            ack = self._on_request(req)
            if not isinstance(ack, XferAck):
                raise TypeError(f"on_request returned {type(ack).__name__}, not an XferAck")
            return ack
        except Exception:
            return self._internal(req)

    def _encoded(self, req: XferReq, ack: XferAck) -> bytes:
        try:
            return encode(ack)
        except Exception:  # an ack the codec refuses is the callback's fault, as a raise is
            return encode(self._internal(req))

    def _internal(self, req: XferReq) -> XferAck:
        self.callback_errors += 1
        log.exception("control_request_failed", mm_hash=req.mm_hash, consumer=req.consumer)
        return XferAck(PROTOCOL_VERSION, req.mm_hash, AckStatus.NACK_INTERNAL)

    def _finish(self, done: XferDone) -> None:
        assert self._on_done is not None
        try:
            self._on_done(done)
            self.done += 1
        except Exception:
            self.callback_errors += 1
            log.exception("control_done_failed", mm_hash=done.mm_hash, grant_id=done.grant_id)

    def _reply(self, peer: bytes, payload: bytes) -> None:
        try:
            # ROUTER_MANDATORY: a vanished peer or a full queue raises instead of dropping unseen.
            self._sock.send_multipart([peer, *seal(self._auth, ACK, payload)], zmq.NOBLOCK)
        except zmq.ZMQError as err:
            self._drops.drop("unsent", err.strerror, peer=peer.hex())
            return
        self.answered += 1

    # -- setup and teardown ----------------------------------------------------------------------

    def _bind(self, host: str, port: int, heartbeat: Heartbeat, hwm: int) -> zmq.Socket:
        endpoint, ipv6 = tcp_endpoint(host, port)
        sock = self._ctx.socket(zmq.ROUTER)
        try:
            common_options(sock, ipv6=ipv6, hwm=hwm)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            heartbeat.apply(sock)
            sock.bind(endpoint)
        except zmq.ZMQError as err:
            sock.close(linger=0)
            self._ctx.term()
            raise ControlBindError(
                err.errno,
                f"cannot bind the EC side channel at {host}:{port} ({endpoint}): {err.strerror}. "
                "Another process may hold the port, or the host is not a local address: set "
                "VLLM_EC_SIDE_CHANNEL_HOST and VLLM_EC_SIDE_CHANNEL_PORT to a free local address.",
            ) from err
        return sock

    def _release(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()
