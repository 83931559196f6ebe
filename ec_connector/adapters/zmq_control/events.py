"""The event feed: the EventSink port over a ZMQ publisher, and the decoder subscribers use.

An orchestrator subscribes (ZMQ SUB) to `event_feed_address` and learns when an engine's encodings
appear or go away, so it stops forwarding `ec_transfer_params` for entries that are gone.

Wire format (`FEED_VERSION` 1). Each event is one two-frame ZMQ message:

    frame 0, topic:    b"ec." + kind        (b"ec.stored", b"ec.evicted", b"ec.announced", b"ec.expired")
    frame 1, payload:  MessagePack map {"version": 1, "kind": str, "seq": int, "ts": float,
                                        "engine_id": str, "mm_hash": str, "size_bytes": int}

With `side_channel_secret` set, every event carries a third frame, the trailer of auth.py
(timestamp | nonce | HMAC-SHA256 of the secret over label b"ec-feed/event", timestamp, nonce and
the payload): a subscriber holding the secret refuses events whose MAC does not verify, whose
timestamp is outside the window, or whose nonce it saw (replay); a subscriber without the secret
refuses them all, as one with a secret refuses unauthenticated events (fails closed, visibly).

Hello frames. A feed whose engine serves its entries to peers (a side channel) also sends, at
once and then every second, a hello message on topic b"ec-hello" (not under b"ec.", so a
subscriber to b"ec." or to one kind never receives it):

    frame 0, topic:    b"ec-hello"
    frame 1, payload:  MessagePack map {"version": 1, "kind": "hello", "ts": float, "engine_id": str,
                                        "dp_rank": int, "boot": str, "peer_host": str, "peer_port": int}

`boot` is random per process start: a peer that hears a new boot behind a known feed knows its
publisher restarted. With the secret, a hello carries the trailer too, under the label
b"ec-feed/hello" (a hello cannot be replayed as an event, nor an event as a hello).
`decode_hello` reads one; `decode_event` refuses one with EventFrameError, as any frame not an
event, so a subscriber to b"" that skips what it cannot decode keeps working.

Subscribe to b"ec." for every kind, or to one topic. `seq` counts every event this publisher was
handed, from 1, so a gap in `seq` is an event the subscriber missed (dropped at a full queue, or
sent before it connected). `ts` is the publisher's wall clock (Unix seconds). `version` comes
first in every version's payload; a subscriber refuses a version it does not read.

Publishing never blocks: the socket is an XPUB with `XPUB_NODROP`, so a subscriber queue at its
high-water mark makes the send fail at once (EAGAIN); the event is dropped and counted (`dropped`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog
import zmq

from ec_connector.domain.errors import ProtocolError
from ec_connector.domain.transfers import CacheEvent, EventKind

from .auth import AuthFailure, FrameAuth

log = structlog.get_logger(__name__)

FEED_VERSION = 1
TOPIC_PREFIX = b"ec."
MAX_EVENT_BYTES = 4096
DEFAULT_HWM = 10_000
FEED_LABEL = b"ec-feed/event"
"""What an event's MAC is computed under, so that no control frame can be played as an event."""
HELLO_TOPIC = b"ec-hello"
HELLO_LABEL = b"ec-feed/hello"
HELLO_EVERY_S = 1.0
MAX_HELLO_TEXT = 256  # engine id, boot or host: longer is refused


def topic(kind: EventKind | str) -> bytes:
    """The topic frame of events of `kind` (subscribe to it to receive only those)."""
    return TOPIC_PREFIX + EventKind(kind).value.encode()


class EventFrameError(ProtocolError):
    """A message on the feed is not an event this decoder reads; the text says why."""


class EventFeedBindError(ValueError):
    """`event_feed_address` could not be bound."""


@dataclass(frozen=True, slots=True)
class FeedEvent:
    """One decoded event: what happened to entry `mm_hash` on engine `engine_id`."""

    version: int
    kind: EventKind
    seq: int
    ts: float
    engine_id: str
    mm_hash: str
    size_bytes: int


class _Payload(msgspec.Struct, frozen=True):
    version: int
    kind: str
    seq: int
    ts: float
    engine_id: str
    mm_hash: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Hello:
    """What a feed's publisher says of itself: its engine id and data-parallel rank, its boot
    (random per process start) and its side channel (where peers send XferReq)."""

    engine_id: str
    boot: str
    peer_host: str
    peer_port: int
    dp_rank: int = 0


class _HelloPayload(msgspec.Struct, frozen=True):
    version: int
    kind: str
    ts: float
    engine_id: str
    dp_rank: int
    boot: str
    peer_host: str
    peer_port: int


class _Probe(msgspec.Struct, frozen=True):
    version: int


_encoder = msgspec.msgpack.Encoder()
_probe = msgspec.msgpack.Decoder(_Probe)
_payload = msgspec.msgpack.Decoder(_Payload)
_hello = msgspec.msgpack.Decoder(_HelloPayload)
_KINDS = ", ".join(k.value for k in EventKind)


def encode_event(event: CacheEvent, *, seq: int, ts: float, auth: FrameAuth | None = None) -> list[bytes]:
    """The frames of `event`: topic and payload, and the trailer when `auth` is given."""
    body = _Payload(
        version=FEED_VERSION,
        kind=EventKind(event.kind).value,
        seq=seq,
        ts=ts,
        engine_id=event.engine_id,
        mm_hash=event.mm_hash,
        size_bytes=event.size_bytes,
    )
    payload = _encoder.encode(body)
    if auth is None:
        return [topic(event.kind), payload]
    return [topic(event.kind), payload, auth.seal(FEED_LABEL, payload)]


def encode_hello(hello: Hello, *, ts: float, auth: FrameAuth | None = None) -> list[bytes]:
    """The frames of `hello`: topic and payload, and the trailer when `auth` is given."""
    payload = _encoder.encode(
        _HelloPayload(
            version=FEED_VERSION,
            kind="hello",
            ts=ts,
            engine_id=hello.engine_id,
            dp_rank=hello.dp_rank,
            boot=hello.boot,
            peer_host=hello.peer_host,
            peer_port=hello.peer_port,
        )
    )
    if auth is None:
        return [HELLO_TOPIC, payload]
    return [HELLO_TOPIC, payload, auth.seal(HELLO_LABEL, payload)]


def decode_hello(frames: Sequence[bytes | memoryview], auth: FrameAuth | None = None) -> Hello:
    """The hello in one feed message, authenticated with `auth` when given; raises
    EventFrameError naming the problem."""
    payload = _checked_payload(frames, auth, HELLO_LABEL, "hello")
    if bytes(frames[0]) != HELLO_TOPIC:
        raise EventFrameError(f"topic {bytes(frames[0])[:64]!r} is not the hello topic {HELLO_TOPIC!r}")
    try:
        body = _hello.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise EventFrameError(f"malformed version-{FEED_VERSION} hello: {err}") from err
    if body.kind != "hello":
        raise EventFrameError(f"hello payload of kind {body.kind!r}")
    for name in ("engine_id", "boot", "peer_host"):
        text = getattr(body, name)
        if not 0 < len(text) <= MAX_HELLO_TEXT:
            raise EventFrameError(f"hello {name} of {len(text)} characters (expected 1-{MAX_HELLO_TEXT})")
    if not 0 < body.peer_port < 65536 or body.dp_rank < 0:
        raise EventFrameError(
            f"hello names port {body.peer_port} and rank {body.dp_rank} (expected 1-65535 and >= 0)"
        )
    return Hello(body.engine_id, body.boot, body.peer_host, body.peer_port, body.dp_rank)


def _checked_payload(
    frames: Sequence[bytes | memoryview], auth: FrameAuth | None, label: bytes, what: str
) -> bytes:
    """The payload of a feed message whose frame count, size, trailer and version check out."""
    if auth is None and len(frames) == 3:
        raise EventFrameError(
            f"{what} message has 3 frame(s), expected 2 (topic, payload): the feed authenticates its "
            f"{what}s but no secret is configured here"
        )
    if auth is not None and len(frames) == 2:
        raise EventFrameError(f"unauthenticated {what}, but a secret is configured here")
    expected = 2 if auth is None else 3
    if len(frames) != expected:
        shape = "topic, payload" if auth is None else "topic, payload, trailer"
        raise EventFrameError(f"{what} message has {len(frames)} frame(s), expected {expected} ({shape})")
    payload = bytes(frames[1])
    if len(payload) > MAX_EVENT_BYTES:
        raise EventFrameError(f"{what} payload of {len(payload)} bytes exceeds {MAX_EVENT_BYTES}")
    if auth is not None:
        try:
            auth.check(label, payload, bytes(frames[2]))
        except AuthFailure as err:
            raise EventFrameError(str(err)) from None
    try:
        version = _probe.decode(payload).version
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise EventFrameError(f"malformed {what} payload ({len(payload)} bytes): {err}") from err
    if version != FEED_VERSION:
        raise EventFrameError(
            f"{what} speaks feed version {version}, this subscriber reads version {FEED_VERSION}: "
            "upgrade the older side"
        )
    return payload


def decode_event(frames: Sequence[bytes | memoryview], auth: FrameAuth | None = None) -> FeedEvent:
    """The event in one feed message (its frames), authenticated with `auth` when given (the
    feed's `side_channel_secret`); raises EventFrameError naming the problem (a hello message
    too: `decode_hello` reads those)."""
    if len(frames) > 1 and bytes(frames[0]) == HELLO_TOPIC:
        raise EventFrameError(f"a hello message ({HELLO_TOPIC!r}), not an event: decode_hello reads it")
    if len(frames) == (2 if auth is None else 3):
        head = bytes(frames[0])
        if not head.startswith(TOPIC_PREFIX):
            raise EventFrameError(
                f"topic {head[:64]!r} is not an ec_connector event topic (expected b'ec.<kind>')"
            )
    payload = _checked_payload(frames, auth, FEED_LABEL, "event")
    head, version = bytes(frames[0]), FEED_VERSION
    try:
        body = _payload.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise EventFrameError(f"malformed version-{version} event: {err}") from err
    try:
        kind = EventKind(body.kind)
    except ValueError:
        raise EventFrameError(f"unknown event kind {body.kind!r} (known: {_KINDS})") from None
    if head != topic(kind):
        raise EventFrameError(f"topic {head!r} does not match the event's kind {kind.value!r}")
    return FeedEvent(
        version=version,
        kind=kind,
        seq=body.seq,
        ts=body.ts,
        engine_id=body.engine_id,
        mm_hash=body.mm_hash,
        size_bytes=body.size_bytes,
    )


SUBSCRIPTIONS_EVERY = 64
"""The subscription messages an XPUB socket queues for its owner are read (and dropped) at the first
publish and then every this many: looking for them (a refused non-blocking receive) was nearly half
of a publish's cost on the CPU VM (32 events 263 against 146 µs, `bench/completions.py`), and they
arrive only as subscribers come and go."""


class ZmqEventSink:
    """EventSink port: publishes cache events on an XPUB socket bound at `address`.

    Thread-safe (the scheduler thread and the control server's I/O thread both publish).
    `published` and `dropped` count events sent and events refused at a full subscriber queue.
    With `secret`, every event carries its authentication trailer. `start_hello` sends hello
    frames from a thread of the sink's own (never the caller's): at once, then every `every_s`.
    """

    def __init__(
        self,
        address: str,
        *,
        hwm: int = DEFAULT_HWM,
        wall_clock: Callable[[], float] = time.time,
        secret: str | None = None,
    ) -> None:
        self._auth = FrameAuth(secret) if secret else None
        self._context = zmq.Context()
        self._socket: Any = self._context.socket(zmq.XPUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, hwm)
        self._socket.setsockopt(zmq.XPUB_NODROP, 1)
        try:
            self._socket.bind(address)
        except zmq.ZMQError as err:
            self._socket.close(linger=0)
            self._context.term()
            raise EventFeedBindError(
                f"ec_connector_extra_config['event_feed_address'] = {address!r} cannot be bound ({err}): "
                'expected a free ZMQ endpoint such as "tcp://127.0.0.1:5610" or "ipc:///tmp/ec_events"'
            ) from err
        self.address: str = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._seq = 0
        self._closed = False
        self._hello_stop = threading.Event()
        self._hello_thread: threading.Thread | None = None
        self.published = 0
        self.dropped = 0
        self.hellos = 0
        log.info("event_feed_bound", address=self.address)

    def start_hello(self, hello: Hello, *, every_s: float = HELLO_EVERY_S) -> None:
        """Send `hello` at once and then every `every_s` until `close`, from a daemon thread."""
        if not every_s > 0:
            raise ValueError(f"hello every_s must be > 0, got {every_s!r}")
        if self._hello_thread is not None:
            raise RuntimeError("the feed already sends hello frames")
        self._hello_thread = threading.Thread(
            target=self._say_hello, args=(hello, every_s), name="ec-feed-hello", daemon=True
        )
        self._hello_thread.start()
        log.info("event_feed_hello", engine_id=hello.engine_id, boot=hello.boot, peer_port=hello.peer_port)

    def _say_hello(self, hello: Hello, every_s: float) -> None:
        while not self._hello_stop.is_set():
            with self._lock:
                if self._closed:
                    return
                frames = encode_hello(hello, ts=self._wall_clock(), auth=self._auth)
                try:
                    self._socket.send_multipart(frames, flags=zmq.NOBLOCK)
                    self.hellos += 1
                except zmq.ZMQError:
                    pass  # a full queue or a closing socket: the next hello follows in every_s
            self._hello_stop.wait(every_s)

    def publish(self, event: CacheEvent) -> None:
        with self._lock:
            if self._closed:
                return
            self._seq += 1
            if (self._seq - 1) % SUBSCRIPTIONS_EVERY == 0:
                self._drain_subscriptions()
            frames = encode_event(event, seq=self._seq, ts=self._wall_clock(), auth=self._auth)
            try:
                self._socket.send_multipart(frames, flags=zmq.NOBLOCK)
            except zmq.Again:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning("event_feed_full", dropped=self.dropped, kind=event.kind.value)
                return
            except zmq.ZMQError as err:
                self.dropped += 1
                log.warning("event_feed_send_failed", reason=str(err), kind=event.kind.value)
                return
            self.published += 1

    def close(self) -> None:
        self._hello_stop.set()
        if self._hello_thread is not None:
            self._hello_thread.join()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._socket.close(linger=0)
            self._context.term()

    def _drain_subscriptions(self) -> None:
        """Read (and discard) subscription messages so they do not pile up on the socket."""
        while True:
            try:
                self._socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
