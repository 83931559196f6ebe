"""Hello frames on real event feeds (ZmqEventSink.start_hello) read by the fleet's subscriber
(ZmqFleetFeed) driving a real FleetUpdater and PeerDirectory, on 127.0.0.1: a feed configured
alone learns its peer from the hello, a restart behind the same port drops the old records, a
reconnect of the same boot keeps them, and subscribers that do not know hello are not disturbed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from ec_connector.adapters.zmq_control.auth import FrameAuth
from ec_connector.adapters.zmq_control.events import (
    HELLO_TOPIC,
    EventFrameError,
    Hello,
    ZmqEventSink,
    decode_event,
    decode_hello,
    encode_hello,
)
from ec_connector.adapters.zmq_control.fleet_feed import FeedPeer
from ec_connector.domain.directory import Peer
from ec_connector.domain.publish import PeerAddress
from ec_connector.domain.transfers import CacheEvent, EventKind
from tests.contract.test_fleet_feed import LIMIT_S, Wired, wait_for

HELLO = Hello("replica-a", boot="boot-1", peer_host="127.0.0.1", peer_port=5601)
A = Peer("replica-a", PeerAddress("127.0.0.1", 5601), boot="boot-1")
STORED = CacheEvent(EventKind.STORED, "img", "replica-a", 4096)


def feed_at(port: int, hello: Hello | None = HELLO, secret: str | None = None) -> ZmqEventSink:
    sink = ZmqEventSink(f"tcp://127.0.0.1:{port}", secret=secret)
    if hello is not None:
        sink.start_hello(hello, every_s=0.05)
    return sink


def free_tcp_port() -> int:
    sink = ZmqEventSink("tcp://127.0.0.1:*")
    port = int(sink.address.rsplit(":", 1)[1])
    sink.close()
    return port


@pytest.fixture
def port() -> int:
    return free_tcp_port()


def stored_until_located(sink: ZmqEventSink, wired: Wired, key: str = "img") -> bool:
    event = CacheEvent(EventKind.STORED, key, "replica-a", 4096)
    return wait_for(lambda: wired.directory.locate(key) is not None, tick=lambda: sink.publish(event))


@pytest.fixture
def alone(port: int) -> Iterator[tuple[ZmqEventSink, Wired]]:
    sink = feed_at(port)
    wired = Wired([FeedPeer(None, f"tcp://127.0.0.1:{port}")])
    yield sink, wired
    wired.feed.close()
    sink.close()


def test_a_feed_configured_alone_learns_its_peer_from_the_hello(alone):
    sink, wired = alone
    assert wait_for(lambda: wired.directory.peer("replica-a") == A)
    assert stored_until_located(sink, wired)
    holder = wired.directory.locate("img")
    assert holder is not None and holder.peer == A and wired.feed.rejected == 0


def test_events_of_a_feed_whose_peer_has_not_said_hello_are_not_served(port):
    sink = feed_at(port, hello=None)
    wired = Wired([FeedPeer(None, f"tcp://127.0.0.1:{port}")])
    try:
        assert wait_for(lambda: wired.feed.unidentified > 0, tick=lambda: sink.publish(STORED))
        assert wired.directory.peers() == () and len(wired.directory) == 0
        sink.start_hello(HELLO, every_s=0.05)
        assert stored_until_located(sink, wired)
    finally:
        wired.feed.close()
        sink.close()


def test_a_restart_behind_the_same_port_drops_the_old_records_at_once(alone, port):
    sink, wired = alone
    assert stored_until_located(sink, wired, "old")
    sink.close()
    restarted = feed_at(port, Hello("replica-a", boot="boot-2", peer_host="127.0.0.1", peer_port=5601))
    try:
        assert wait_for(lambda: wired.stats.peers_restarted == 1)
        assert wired.directory.locate("old") is None and len(wired.directory) == 0
        assert wired.directory.peer("replica-a") == Peer("replica-a", A.address, boot="boot-2")
        assert stored_until_located(restarted, wired, "new")
    finally:
        restarted.close()


def test_a_reconnect_of_the_same_boot_serves_the_kept_records_again(alone, port):
    """The same boot behind the same port (as a process whose feed connection dropped and came
    back: the subscriber cannot tell the two apart, which is the point of the boot)."""
    sink, wired = alone
    assert stored_until_located(sink, wired, "kept")
    sink.close()
    assert wait_for(lambda: wired.directory.locate("kept") is None and wired.stats.peers_left == 1)
    back = feed_at(port)
    try:
        assert wait_for(lambda: wired.stats.peers_returned == 1)
        assert wired.directory.locate("kept") == (A, 4096) and wired.stats.peers_restarted == 0
    finally:
        back.close()


def test_a_configured_peer_keeps_its_id_and_side_channel_and_takes_the_boot_of_its_hello(port):
    configured = Peer("replica-a", PeerAddress("127.0.0.1", 5601))
    sink = feed_at(port)
    wired = Wired([FeedPeer(configured, f"tcp://127.0.0.1:{port}")])
    try:
        assert wait_for(lambda: wired.directory.peer("replica-a") == A)
        assert stored_until_located(sink, wired)
    finally:
        wired.feed.close()
        sink.close()


def test_a_hello_claiming_another_feeds_peer_is_refused(port):
    other = free_tcp_port()
    sink, twin = feed_at(port), feed_at(other)  # both say they are replica-a
    wired = Wired([FeedPeer(None, f"tcp://127.0.0.1:{port}"), FeedPeer(None, f"tcp://127.0.0.1:{other}")])
    try:
        assert wait_for(lambda: wired.feed.rejected > 0 and wired.directory.peer("replica-a") == A)
        assert [p.peer_id for p in wired.directory.peers()] == ["replica-a"]
        assert wired.stats.feed_frames_rejected == wired.feed.rejected
    finally:
        wired.feed.close()
        sink.close()
        twin.close()


def test_this_engines_own_hello_is_ignored(port):
    sink = feed_at(port)
    wired = Wired([FeedPeer(None, f"tcp://127.0.0.1:{port}")], boot="boot-1")
    try:
        assert wait_for(lambda: wired.feed.hellos >= 3)
        assert wired.directory.peers() == ()
    finally:
        wired.feed.close()
        sink.close()


def test_subscribers_to_the_event_topics_never_see_a_hello(port):
    sink = feed_at(port)
    ctx = zmq.Context()
    events, everything = ctx.socket(zmq.SUB), ctx.socket(zmq.SUB)
    try:
        for sub, prefix in ((events, b"ec."), (everything, b"")):
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, prefix)
            sub.connect(sink.address)
        assert everything.poll(int(LIMIT_S * 1000)), "hellos flow"
        hello_frames = everything.recv_multipart()
        assert hello_frames[0] == HELLO_TOPIC and decode_hello(hello_frames) == HELLO
        with pytest.raises(EventFrameError, match="not an event: decode_hello reads it"):
            decode_event(hello_frames)
        assert wait_for(lambda: events.poll(0) != 0, tick=lambda: sink.publish(STORED))
        received = []
        while events.poll(200):
            received.append(decode_event(events.recv_multipart()))
        assert received and all(e.mm_hash == "img" for e in received), "only events, never a hello"
        assert sink.hellos >= 2
    finally:
        events.close(linger=0)
        everything.close(linger=0)
        ctx.term()
        sink.close()


def test_with_the_fleets_secret_hellos_are_authenticated(port):
    sink = feed_at(port, secret="fleet-secret")
    wired = Wired([FeedPeer(None, f"tcp://127.0.0.1:{port}")], secret="fleet-secret")
    try:
        assert stored_until_located(sink, wired) and wired.feed.rejected == 0
    finally:
        wired.feed.close()
        sink.close()
    auth = FrameAuth("fleet-secret")
    sealed = encode_hello(HELLO, ts=0.0, auth=FrameAuth("fleet-secret"))
    assert decode_hello(sealed, auth) == HELLO
    with pytest.raises(EventFrameError, match="not an event"):
        decode_event(sealed, auth)
    forged = encode_hello(HELLO, ts=0.0, auth=FrameAuth("another"))
    with pytest.raises(EventFrameError):
        decode_hello(forged, FrameAuth("fleet-secret"))
    with pytest.raises(EventFrameError, match="unauthenticated hello"):
        decode_hello(encode_hello(HELLO, ts=0.0), auth)


@pytest.mark.parametrize(
    ("hello", "message"),
    [
        (Hello("", "b", "h", 1), "hello engine_id of 0 characters"),
        (Hello("e", "", "h", 1), "hello boot of 0 characters"),
        (Hello("e", "b", "h", 0), "hello names port 0"),
        (Hello("e", "b", "h", 1, dp_rank=-1), "rank -1"),
    ],
)
def test_hellos_that_name_no_reachable_peer_are_refused(hello, message):
    with pytest.raises(EventFrameError, match=message):
        decode_hello(encode_hello(hello, ts=0.0))
