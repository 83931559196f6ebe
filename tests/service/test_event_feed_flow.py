"""The event feed tells an orchestrator an announced entry is gone before a consumer would be
refused it: a producer tier publishes on a real ZMQ feed, answers over the real ZMQ control plane,
and a real SUB socket plays the orchestrator. Regions and copies are the in-memory fakes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from ec_connector.adapters.memory import MemoryPeerTransport, MemoryPeerWorld
from ec_connector.adapters.zmq_control import ZmqControlClient, ZmqControlServer
from ec_connector.adapters.zmq_control.events import FeedEvent, ZmqEventSink, decode_event
from ec_connector.application import TierScheduler
from ec_connector.application.consumer import ConsumerFetcher, WantedItem
from ec_connector.application.producer import ProducerDesk
from ec_connector.application.stats import PeerStats
from ec_connector.domain.config import Role
from ec_connector.domain.transfers import CacheEvent, EventKind

from .conftest import Engine

FP = "fingerprint-a"
META = {"image_grid_thw": [1, 4, 4]}
WAIT_LIMIT_S = 10.0  # bound on waiting for real sockets (not an assertion on speed)


class Feed:
    """An orchestrator's view of the feed: a SUB socket and the events it decoded."""

    def __init__(self, sink: ZmqEventSink) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.connect(sink.address)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"ec.")
        deadline = time.monotonic() + WAIT_LIMIT_S
        while not self.sub.poll(20):  # publish until the subscription has reached the publisher
            assert time.monotonic() < deadline, "subscription never arrived"
            sink.publish(CacheEvent(EventKind.STORED, "warm-up", "x", 0))
        while self.sub.poll(50):
            self.sub.recv_multipart()

    def next(self) -> FeedEvent:
        assert self.sub.poll(int(WAIT_LIMIT_S * 1000)), "no event arrived"
        return decode_event(self.sub.recv_multipart())

    def close(self) -> None:
        self.sub.close(linger=0)
        self.ctx.term()


@pytest.fixture
def producer() -> Iterator[tuple[Engine, ZmqEventSink]]:
    eng = Engine(role=Role.PRODUCER, num_blocks=8, announce_lease_s=5.0)
    sink = ZmqEventSink("tcp://127.0.0.1:*")
    eng.scheduler = TierScheduler(
        config=eng.config, region=eng.region, clock=eng.clock, events=sink, ranks=1, engine_id="prod-1"
    )
    yield eng, sink
    sink.close()


def test_an_eviction_reaches_the_subscriber_before_a_consumer_is_refused_the_entry(producer):
    eng, sink = producer
    feed = Feed(sink)
    server = ZmqControlServer("127.0.0.1", 0)
    desk = ProducerDesk(
        tier=eng.scheduler,
        config=eng.config,
        clock=eng.clock,
        fingerprint=FP,
        address=server.address,
        agent_name="prod-1_dp0",
        agent_metadata=b"agent-metadata",
        stats=PeerStats(),
    )
    server.start(desk.answer, desk.done)
    consumer = Engine(role=Role.CONSUMER, num_blocks=8, clock=eng.clock)
    consumer_stats = PeerStats()
    control = ZmqControlClient()
    fetcher = ConsumerFetcher(
        tier=consumer.scheduler,
        config=consumer.config,
        clock=eng.clock,
        control=control,
        transport=MemoryPeerTransport(MemoryPeerWorld(), "cons", consumer.region),
        fingerprint=FP,
        engine_id="cons-1",
        stats=consumer_stats,
    )
    try:
        # the producer encodes and announces img-a: the orchestrator keeps its params
        eng.step([("img-a", 4)])
        eng.settle()
        params = desk.publish({"img-a": META})
        assert set(params["img-a"]) == {"metadata", "peer_host", "peer_port", "size_bytes"}
        held = {"img-a": params["img-a"]}
        stored, announced = feed.next(), feed.next()
        assert (stored.kind, stored.mm_hash, stored.engine_id) == (EventKind.STORED, "img-a", "prod-1")
        assert (announced.kind, announced.mm_hash) == (EventKind.ANNOUNCED, "img-a")
        assert announced.size_bytes == params["img-a"]["size_bytes"] and announced.seq == stored.seq + 1

        # the announcement lease ends, then pressure evicts the entry
        eng.clock.advance(5.0)
        eng.scheduler.poll()
        expired = feed.next()
        assert (expired.kind, expired.mm_hash) == (EventKind.EXPIRED, "img-a")
        eng.step([("img-b", 8)])
        evicted = feed.next()
        assert (evicted.kind, evicted.mm_hash, evicted.engine_id) == (EventKind.EVICTED, "img-a", "prod-1")
        assert evicted.size_bytes == params["img-a"]["size_bytes"]
        held.pop(evicted.mm_hash)  # what examples/event_subscriber.py tells an orchestrator to do
        assert held == {}
        assert not eng.scheduler.holds("img-a")

        # an orchestrator without the feed would still forward the params: the producer refuses them
        wanted = [WantedItem("img-a", 4)]
        assert fetcher.ensure_available("r1", params, wanted) is False
        deadline = time.monotonic() + WAIT_LIMIT_S
        while consumer_stats.nack_missing == 0:
            assert time.monotonic() < deadline, "no ack arrived"
            time.sleep(0.01)
            fetcher.poll()
        assert consumer_stats.nack_missing == 1 and consumer_stats.fallbacks == 1
        assert fetcher.ensure_available("r1", params, wanted) is True, "encoded locally instead"
    finally:
        control.close()
        server.close()
        feed.close()


def test_without_an_address_the_container_keeps_the_log_sink_and_with_one_publishes(tmp_path):
    from ec_connector.adapters.system import LogEventSink
    from ec_connector.container import build_container

    settings = dict(role="ec_both", tier="memory", device="memory", hidden_dim=4, dtype="bfloat16")
    plain = build_container(extra={"ec_cpu_bytes": 4096}, **settings)
    assert isinstance(plain.events(), LogEventSink)
    plain.shutdown_resources()
    address = f"ipc://{tmp_path}/feed"
    fed = build_container(extra={"ec_cpu_bytes": 4096, "event_feed_address": address}, **settings)
    sink = fed.events()
    assert isinstance(sink, ZmqEventSink) and sink.address == address
    assert fed.tier_scheduler()._events is sink
    feed = Feed(sink)
    try:
        tier = fed.tier_scheduler()
        tier.reserve_fetch("img-z", 2, now=0.0, lease_s=60.0)  # a peer READ lands it: STORED
        tier.finish_fetch("img-z")
        event = feed.next()
        assert (event.kind, event.mm_hash, event.size_bytes) == (EventKind.STORED, "img-z", 2 * 4 * 2)
    finally:
        feed.close()
        fed.shutdown_resources()
    published = sink.published
    sink.publish(CacheEvent(EventKind.STORED, "after-shutdown", "x", 1))  # closed: a no-op, no raise
    assert sink.published == published


def test_the_data_parallel_ranks_of_one_engine_each_bind_their_own_feed(tmp_path):
    from ec_connector.container import build_container

    address = f"ipc://{tmp_path}/feed"
    extra = {"ec_cpu_bytes": 4096, "event_feed_address": address}
    settings = dict(role="ec_both", tier="memory", device="memory", hidden_dim=4, dtype="bfloat16")
    ranks = [build_container(extra=extra, dp_rank=r, **settings) for r in (0, 1)]
    try:
        sinks = [c.events() for c in ranks]  # both bound at once: they used to collide on one address
        assert [s.address for s in sinks] == [address, f"{address}_dp1"]
        feed = Feed(sinks[1])
        try:
            ranks[1].tier_scheduler().reserve_fetch("img-r1", 1, now=0.0, lease_s=60.0)
            ranks[1].tier_scheduler().finish_fetch("img-r1")
            assert feed.next().mm_hash == "img-r1"
        finally:
            feed.close()
    finally:
        for container in ranks:
            container.shutdown_resources()


def test_the_subscriber_example_prints_events_and_drops_evicted_params():
    import select
    import signal
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "event_subscriber.py"
    sink = ZmqEventSink("tcp://127.0.0.1:*")
    # started with SIGINT ignored, as a shell's background job is: SIGINT must still stop it
    ignoring = ["sh", "-c", 'trap "" INT; exec "$0" "$@"']
    cmd = [*ignoring, sys.executable, str(example), sink.address, "--only", "announced", "--only", "evicted"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []

    def read_line(publish: CacheEvent) -> str:
        deadline = time.monotonic() + WAIT_LIMIT_S * 3
        while time.monotonic() < deadline and proc.poll() is None:
            sink.publish(publish)
            if select.select([proc.stdout], [], [], 0.1)[0]:
                return proc.stdout.readline()
        raise AssertionError(f"the example printed nothing: {proc.stderr.read() if proc.poll() else ''}")

    try:
        # ZMQ drops what is sent before the subscription arrives: announce until one is printed
        lines.append(read_line(CacheEvent(EventKind.ANNOUNCED, "img-a", "prod-1", 64)))
        sink.publish(CacheEvent(EventKind.STORED, "img-b", "prod-1", 8))  # filtered out
        while "evicted" not in lines[-1]:
            lines.append(read_line(CacheEvent(EventKind.EVICTED, "img-a", "prod-1", 64)))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=WAIT_LIMIT_S)
        sink.close()
    assert proc.returncode == 0
    assert all("announced img-a 64 B" in line for line in lines[:-1]) and "img-b" not in "".join(lines)
    assert "evicted   img-a 64 B -> drop its ec_transfer_params" in lines[-1], lines
