"""The fleet's feed subscriber (ZmqFleetFeed) against real event feeds (ZmqEventSink) on 127.0.0.1,
driving a real FleetUpdater and PeerDirectory: what a peer publishes becomes locatable, a peer
whose feed goes away drops out, hostile frames are dropped without stopping the thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
import zmq

from ec_connector.adapters.memory import ManualClock
from ec_connector.adapters.zmq_control.events import ZmqEventSink
from ec_connector.adapters.zmq_control.fleet_feed import FeedPeer, ZmqFleetFeed
from ec_connector.application.fleet import FleetStats, FleetUpdater
from ec_connector.domain.directory import Peer, PeerDirectory
from ec_connector.domain.publish import PeerAddress
from ec_connector.domain.transfers import CacheEvent, EventKind

LIMIT_S = 10.0  # bound on waiting for sockets to connect (not an assertion of speed)
A = Peer("replica-a", PeerAddress("127.0.0.1", 5601), boot="1")


def wait_for(
    condition: Callable[[], bool], *, limit_s: float = LIMIT_S, tick: Callable[[], None] = lambda: None
) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if condition():
            return True
        tick()
        time.sleep(0.01)
    return condition()


class Wired:
    """A fleet feed subscribed to `sink`, driving an updater over a fresh directory."""

    def __init__(self, feeds: list[FeedPeer], *, secret: str | None = None, boot: str = "") -> None:
        self.directory = PeerDirectory()
        self.stats = FleetStats()
        self.updater = FleetUpdater(
            directory=self.directory,
            clock=ManualClock(),
            engine_id="replica-b",
            heartbeat_timeout_s=3.0,
            stats=self.stats,
            boot=boot,
        )
        self.gone: list[str] = []
        self.ticks = threading.Event()

        def gone(peer_id: str) -> None:
            self.gone.append(peer_id)
            self.updater.peer_gone(peer_id)

        def tick() -> None:
            self.updater.tick()
            self.ticks.set()

        self.feed = ZmqFleetFeed(
            feeds,
            on_seen=self.updater.peer_seen,
            on_event=lambda event, seq: self.updater.apply(event, seq=seq),
            on_gone=gone,
            on_tick=tick,
            on_rejected=self.updater.frame_rejected,
            tick_s=0.05,
            secret=secret,
        )
        self.feed.start()


@pytest.fixture
def sink() -> Iterator[ZmqEventSink]:
    feed = ZmqEventSink("tcp://127.0.0.1:*")
    yield feed
    feed.close()


@pytest.fixture
def wired(sink: ZmqEventSink) -> Iterator[Wired]:
    wired = Wired([FeedPeer(A, sink.address)])
    yield wired
    wired.feed.close()


def publish_until_located(sink: ZmqEventSink, wired: Wired, key: str) -> bool:
    """Publish `key` as stored until the subscriber has it (a subscription takes a moment to reach
    the publisher: events before that are not delivered, as on any ZMQ feed)."""
    event = CacheEvent(EventKind.STORED, key, "engine-a", 4096)
    return wait_for(lambda: wired.directory.locate(key) is not None, tick=lambda: sink.publish(event))


def test_a_peer_is_joined_on_connect_and_its_stored_entries_become_locatable(sink, wired):
    assert wait_for(lambda: wired.directory.peer(A.peer_id) == A)
    assert publish_until_located(sink, wired, "img")
    holder = wired.directory.locate("img")
    assert holder is not None and holder.peer == A and holder.size_bytes == 4096
    assert wired.feed.received >= 1 and wired.ticks.wait(LIMIT_S)


def test_an_evicted_event_removes_the_entry(sink, wired):
    assert publish_until_located(sink, wired, "img")
    sink.publish(CacheEvent(EventKind.EVICTED, "img", "engine-a", 4096))
    assert wait_for(lambda: wired.directory.locate("img") is None)


def test_a_peer_whose_feed_closes_drops_out_at_once(sink, wired):
    assert publish_until_located(sink, wired, "img")
    started = time.monotonic()
    sink.close()
    assert wait_for(lambda: wired.gone == [A.peer_id])
    assert wired.directory.locate("img") is None and wired.directory.peer(A.peer_id) is None
    assert time.monotonic() - started < 3.0, "a closed connection is seen before the heartbeat timeout"


def test_hostile_frames_are_dropped_and_the_feed_keeps_reading():
    ctx = zmq.Context()
    raw = ctx.socket(zmq.PUB)
    raw.setsockopt(zmq.LINGER, 0)
    port = raw.bind_to_random_port("tcp://127.0.0.1")
    wired = Wired([FeedPeer(A, f"tcp://127.0.0.1:{port}")])
    try:
        assert wait_for(
            lambda: wired.feed.rejected > 0, tick=lambda: raw.send_multipart([b"ec.stored", b"\xff"])
        )
        assert wired.directory.peer(A.peer_id) == A and len(wired.directory) == 0
        assert wired.feed._thread is not None and wired.feed._thread.is_alive()
    finally:
        wired.feed.close()
        raw.close(linger=0)
        ctx.term()


def test_with_the_fleets_secret_authenticated_events_are_applied():
    sink = ZmqEventSink("tcp://127.0.0.1:*", secret="fleet-secret")
    wired = Wired([FeedPeer(A, sink.address)], secret="fleet-secret")
    try:
        assert publish_until_located(sink, wired, "img")
        assert wired.feed.rejected == 0
    finally:
        wired.feed.close()
        sink.close()


@pytest.mark.parametrize(
    ("published_with", "read_with"),
    [("fleet-secret", "another"), ("fleet-secret", None), (None, "fleet-secret")],
    ids=["other-secret", "no-secret-here", "unauthenticated-feed"],
)
def test_events_that_do_not_authenticate_are_dropped_and_counted(published_with, read_with):
    sink = ZmqEventSink("tcp://127.0.0.1:*", secret=published_with)
    wired = Wired([FeedPeer(A, sink.address)], secret=read_with)
    event = CacheEvent(EventKind.STORED, "img", "engine-a", 4096)
    try:
        assert wait_for(lambda: wired.feed.rejected >= 3, tick=lambda: sink.publish(event))
        assert wired.directory.locate("img") is None and len(wired.directory) == 0
        assert wired.feed.received == 0
    finally:
        wired.feed.close()
        sink.close()


def test_peer_ids_must_be_distinct():
    with pytest.raises(ValueError, match="distinct ids"):
        ZmqFleetFeed(
            [FeedPeer(A, "tcp://127.0.0.1:1"), FeedPeer(A, "tcp://127.0.0.1:2")],
            on_seen=print,
            on_event=print,
            on_gone=print,
            on_tick=print,
        )
