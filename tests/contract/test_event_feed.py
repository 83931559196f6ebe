"""The event feed adapter (ZmqEventSink) with real SUB sockets on 127.0.0.1, and its decoder on
hostile frames sent by a raw ZMQ publisher.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import msgspec
import pytest
import zmq

from ec_connector.adapters.zmq_control.events import (
    FEED_VERSION,
    MAX_EVENT_BYTES,
    EventFeedBindError,
    EventFrameError,
    ZmqEventSink,
    decode_event,
    topic,
)
from ec_connector.domain.transfers import CacheEvent, EventKind

JOIN_LIMIT_S = 10.0  # bound on waiting for a subscription to reach the publisher (not an assertion)
WARMUP = CacheEvent(EventKind.STORED, "warm-up", "feed-test", 0)


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def sink() -> Iterator[ZmqEventSink]:
    feed = ZmqEventSink("tcp://127.0.0.1:*", wall_clock=lambda: 1700000000.25)
    yield feed
    feed.close()


def subscribe(context: zmq.Context, sink: ZmqEventSink, *topics: bytes, **opts: int) -> zmq.Socket:
    """A SUB socket connected to `sink` whose subscription has reached it.

    ZMQ drops what a publisher sends before a subscription arrives, so warm-up events are published
    until one is received; every warm-up message is then drained.
    """
    sub = context.socket(zmq.SUB)
    for name, value in opts.items():
        sub.setsockopt(getattr(zmq, name), value)
    sub.connect(sink.address)
    for t in topics or (b"ec.",):
        sub.setsockopt(zmq.SUBSCRIBE, t)
    sub.setsockopt(zmq.SUBSCRIBE, topic(EventKind.STORED))  # warm-up events travel as "stored"
    deadline = time.monotonic() + JOIN_LIMIT_S
    while not sub.poll(20):
        assert time.monotonic() < deadline, "the subscription never reached the publisher"
        sink.publish(WARMUP)
    while sub.poll(50):
        assert decode_event(sub.recv_multipart()).mm_hash == WARMUP.mm_hash
    sub.setsockopt(zmq.UNSUBSCRIBE, topic(EventKind.STORED))  # the caller's own topics stay
    return sub


def receive(sub: zmq.Socket) -> list[bytes]:
    assert sub.poll(int(JOIN_LIMIT_S * 1000)), "no event arrived"
    return sub.recv_multipart()


@pytest.mark.parametrize("kind", list(EventKind))
def test_each_kind_round_trips_with_version_sequence_and_timestamp(context, sink, kind):
    sub = subscribe(context, sink)
    before = sink.published
    sink.publish(CacheEvent(kind, "mm-hash-1", "engine-7", 4096))
    frames = receive(sub)
    assert frames[0] == b"ec." + kind.value.encode()
    event = decode_event(frames)
    assert event.version == FEED_VERSION == 1
    assert (event.kind, event.mm_hash, event.engine_id, event.size_bytes) == (
        kind,
        "mm-hash-1",
        "engine-7",
        4096,
    )
    assert event.ts == 1700000000.25
    assert event.seq == before + 1 and sink.published == before + 1 and sink.dropped == 0
    raw = msgspec.msgpack.decode(frames[1])
    assert list(raw)[0] == "version", "version is the payload's first field"


def test_sequence_numbers_increase_by_one_per_event(context, sink):
    sub = subscribe(context, sink)
    for n in range(5):
        sink.publish(CacheEvent(EventKind.EVICTED, f"k{n}", "e", n))
    seqs = [decode_event(receive(sub)).seq for _ in range(5)]
    assert seqs == list(range(seqs[0], seqs[0] + 5))


def test_a_subscriber_can_take_only_evictions(context, sink):
    sub = subscribe(context, sink, topic(EventKind.EVICTED))
    sink.publish(CacheEvent(EventKind.STORED, "a", "e", 1))
    sink.publish(CacheEvent(EventKind.ANNOUNCED, "a", "e", 1))
    sink.publish(CacheEvent(EventKind.EVICTED, "a", "e", 1))
    event = decode_event(receive(sub))
    assert (event.kind, event.mm_hash) == (EventKind.EVICTED, "a")
    assert not sub.poll(100)


def test_a_full_subscriber_queue_drops_and_counts_without_blocking(context):
    feed = ZmqEventSink("tcp://127.0.0.1:*", hwm=1)
    try:
        sub = subscribe(context, feed, RCVHWM=1, RCVBUF=1024)
        sent = 0
        while feed.dropped == 0:
            assert sent < 1_000_000, "a subscriber that never reads must fill its queue"
            feed.publish(CacheEvent(EventKind.STORED, "x" * 64, "e", sent))
            sent += 1
        received = []
        while sub.poll(200):
            received.append(decode_event(sub.recv_multipart()).seq)
        assert received == sorted(received) and len(received) <= feed.published
        feed.publish(CacheEvent(EventKind.EVICTED, "after", "e", 1))
        # the subscriber sees the loss as a gap in seq
        assert decode_event(receive(sub)).seq > received[-1] + 1
    finally:
        feed.close()


def test_close_is_idempotent_and_publishing_after_close_is_a_no_op():
    feed = ZmqEventSink("tcp://127.0.0.1:*")
    feed.close()
    feed.close()
    feed.publish(CacheEvent(EventKind.STORED, "a", "e", 1))
    assert feed.published == 0


def test_an_address_in_use_is_refused_naming_the_key(sink):
    with pytest.raises(
        EventFeedBindError, match=r"event_feed_address.*cannot be bound.*tcp://127\.0\.0\.1:5610"
    ):
        ZmqEventSink(sink.address)


def test_a_malformed_endpoint_is_refused_naming_the_key():
    with pytest.raises(EventFeedBindError, match=r"'event_feed_address'\] = 'localhost:5600'"):
        ZmqEventSink("localhost:5600")


def _payload(**fields: object) -> bytes:
    body = {
        "version": FEED_VERSION,
        "kind": "evicted",
        "seq": 1,
        "ts": 1.0,
        "engine_id": "e",
        "mm_hash": "k",
        "size_bytes": 8,
    }
    body.update(fields)
    return msgspec.msgpack.encode(body)


HOSTILE = [
    ([b"ec.evicted"], r"1 frame\(s\), expected 2"),
    ([b"ec.evicted", _payload(), b"extra"], r"3 frame\(s\), expected 2"),
    ([b"kv.evicted", _payload()], r"not an ec_connector event topic"),
    ([b"ec.evicted", b"\xc1garbage"], r"malformed event payload"),
    ([b"ec.evicted", msgspec.msgpack.encode([1, 2, 3])], r"malformed event payload"),
    ([b"ec.evicted", _payload(version=2, extra="x")], r"feed version 2, this subscriber reads version 1"),
    ([b"ec.evicted", _payload(size_bytes="8")], r"malformed version-1 event"),
    ([b"ec.evicted", _payload(mm_hash=None)], r"malformed version-1 event"),
    ([b"ec.resurrected", _payload(kind="resurrected")], r"unknown event kind 'resurrected'"),
    ([b"ec.stored", _payload(kind="evicted")], r"does not match the event's kind 'evicted'"),
    ([b"ec.evicted", b"\x00" * (MAX_EVENT_BYTES + 1)], r"exceeds 4096"),
]


def test_hostile_frames_from_a_raw_publisher_raise_clear_errors_in_the_decoder(context):
    pub = context.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = context.socket(zmq.SUB)
    sub.connect(f"tcp://127.0.0.1:{port}")
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    deadline = time.monotonic() + JOIN_LIMIT_S
    while not sub.poll(20):
        assert time.monotonic() < deadline
        pub.send_multipart([b"ec.stored", _payload(kind="stored")])
    while sub.poll(50):
        sub.recv_multipart()
    for frames, _ in HOSTILE:
        pub.send_multipart(frames)
    for frames, message in HOSTILE:
        received = receive(sub)
        assert received == frames
        with pytest.raises(EventFrameError, match=message):
            decode_event(received)
    pub.send_multipart([b"ec.evicted", _payload(mm_hash="still-fine")])
    assert decode_event(receive(sub)).mm_hash == "still-fine", "the subscriber keeps reading after bad frames"


# -- authenticated feed (side_channel_secret set) ----------------------------------------------


def test_with_a_secret_each_event_carries_a_trailer_that_the_same_secret_verifies(context):
    from ec_connector.adapters.zmq_control.auth import FrameAuth

    secured = ZmqEventSink("tcp://127.0.0.1:*", secret="fleet-secret")
    try:
        sub = context.socket(zmq.SUB)
        sub.connect(secured.address)
        sub.setsockopt(zmq.SUBSCRIBE, b"ec.")
        deadline = time.monotonic() + JOIN_LIMIT_S
        event = CacheEvent(EventKind.STORED, "img", "engine-a", 4096)
        while not sub.poll(20):
            assert time.monotonic() < deadline, "the subscription never reached the publisher"
            secured.publish(event)
        frames = sub.recv_multipart()
    finally:
        secured.close()
    assert len(frames) == 3
    decoded = decode_event(frames, FrameAuth("fleet-secret"))
    assert (decoded.kind, decoded.mm_hash, decoded.size_bytes) == (EventKind.STORED, "img", 4096)


def _sealed(secret: str) -> list[bytes]:
    from ec_connector.adapters.zmq_control.auth import FrameAuth
    from ec_connector.adapters.zmq_control.events import encode_event

    event = CacheEvent(EventKind.EVICTED, "img", "engine-a", 4096)
    return encode_event(event, seq=1, ts=1.0, auth=FrameAuth(secret))


@pytest.mark.parametrize(
    ("frames", "secret", "message"),
    [
        (
            lambda: _sealed("s"),
            None,
            "event message has 3 frame(s), expected 2 (topic, payload): the feed authenticates its events "
            "but no secret is configured here",
        ),
        (
            lambda: _sealed("s")[:2],
            "s",
            "unauthenticated event, but a secret is configured here",
        ),
        (
            lambda: _sealed("s"),
            "t",
            "frame MAC does not verify: the peer holds another secret (or none)",
        ),
        (
            lambda: [*_sealed("s")[:2], _sealed("s")[2][:-1]],
            "s",
            "authentication trailer of 55 bytes, expected 56",
        ),
        (
            lambda: [*_sealed("s"), b"x"],
            "s",
            "event message has 4 frame(s), expected 3 (topic, payload, trailer)",
        ),
    ],
    ids=["no-secret-here", "unsealed", "other-secret", "short-trailer", "extra-frame"],
)
def test_events_that_do_not_authenticate_are_refused_naming_why(frames, secret, message):
    from ec_connector.adapters.zmq_control.auth import FrameAuth

    with pytest.raises(EventFrameError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
        decode_event(frames(), FrameAuth(secret) if secret else None)


def test_a_replayed_event_is_refused():
    from ec_connector.adapters.zmq_control.auth import FrameAuth

    auth, frames = FrameAuth("s"), _sealed("s")
    assert decode_event(frames, auth).mm_hash == "img"
    with pytest.raises(EventFrameError, match="nonce already seen inside the window: a replay"):
        decode_event(frames, auth)
