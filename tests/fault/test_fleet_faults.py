"""Fleet pulls meeting faults on real components: a producer process (its /dev/shm region, NIXL
agent, ZMQ ROUTER and desk) as the peer, and in this process a consumer's real adapters behind a
`FleetFetcher` whose peer directory is fed as the feed subscriber feeds it (`FleetUpdater`). A pull
whose peer is gone, whose directory record is stale, or whose entry was evicted between the lookup
and the READ falls back to local encoding within the fetch path's bounds, forgets the record that
led to it, and leaves nothing pinned, no block lost and nothing leaked (`world`'s checks).
"""

from __future__ import annotations

import time

import pytest

from ec_connector.adapters.system import SystemClock
from ec_connector.application.consumer import WantedItem
from ec_connector.application.fleet import FleetFetcher, FleetStats, FleetUpdater
from ec_connector.domain.directory import Peer, PeerDirectory
from ec_connector.domain.publish import PeerAddress
from ec_connector.domain.pull_rule import PullRule
from ec_connector.domain.transfers import CacheEvent, EventKind

from .harness import CONSUMER_EXTRA, HAVE_NIXL, NO_NIXL, SLACK_S, ConsumerSide, ProducerProcess

pytestmark = pytest.mark.skipif(not HAVE_NIXL, reason=NO_NIXL)

ACK_BOUND = CONSUMER_EXTRA["consumer_ack_timeout_s"]
ALWAYS_PULL = PullRule(encode_s_per_row=1.0)  # this suite's items are small: pull every one


class FleetConsumer:
    """`ConsumerSide` with a FleetFetcher in front: requests name no params, the directory does."""

    def __init__(self, side: ConsumerSide) -> None:
        self.side = side
        self.directory = PeerDirectory()
        self.stats = FleetStats()
        self.updater = FleetUpdater(
            directory=self.directory,
            clock=SystemClock(),
            engine_id=side.name,
            heartbeat_timeout_s=3.0,
            stats=self.stats,
        )
        self.fetcher = FleetFetcher(
            tier=side.scheduler,
            fetcher=side.fetcher,
            directory=self.directory,
            updater=self.updater,
            rule=ALWAYS_PULL,
            engine_id=side.name,
            stats=self.stats,
        )
        self._requests = 0

    def learn(self, producer: ProducerProcess, key: str, rows: int) -> None:
        """What the subscriber reports from `producer`'s feed: it is up and stored `key`."""
        block = self.side.scheduler.layout.block_size_bytes
        assert self.updater.peer_seen(Peer(producer.name, PeerAddress(producer.host, producer.port)))
        assert self.updater.apply(CacheEvent(EventKind.STORED, key, producer.name, rows * block), seq=None)

    def fetch(self, key: str, rows: int, *, bound_s: float) -> str:
        """Step one request of `key` until it is no longer deferred: "read" or "fallback"; fails
        past `bound_s` (plus slack)."""
        self._requests += 1
        rid = f"req-{self._requests}"
        wanted = [WantedItem(key, rows, True)]
        deadline = time.monotonic() + bound_s + SLACK_S
        while True:
            self.fetcher.poll()
            done = self.fetcher.ensure_available(rid, None, wanted)
            self.side.scheduler.take_plan()
            if done:
                break
            assert time.monotonic() < deadline, f"request still deferred after {bound_s} s + slack"
            time.sleep(0.002)
        self.fetcher.ensure_available("settle", None, [])  # ends the pull's bookkeeping
        return "read" if self.side.scheduler.is_ready(key) else "fallback"

    def forgotten(self, key: str) -> bool:
        """Whether the directory dropped `key`'s record once the updater ticked."""
        self.updater.tick()
        return self.directory.locate(key) is None


def test_an_item_a_live_peer_holds_is_pulled_byte_exact(world) -> None:
    producer = world["producer"]()
    fleet = FleetConsumer(world["consumer"]())
    assert producer.call("store", key="img-a", rows=24)["stored"]
    fleet.learn(producer, "img-a", 24)
    assert fleet.fetch("img-a", 24, bound_s=ACK_BOUND) == "read"
    fleet.side.assert_read("img-a", 24)
    assert (fleet.stats.pulls_started, fleet.stats.pulls_done, fleet.stats.pulls_failed) == (1, 1, 0)
    fleet.side.assert_clean()


def test_a_stale_record_costs_one_nack_and_is_forgotten(world) -> None:
    producer = world["producer"]()
    fleet = FleetConsumer(world["consumer"]())
    fleet.learn(producer, "ghost", 8)  # an event whose entry the peer never held (or no longer does)
    assert fleet.fetch("ghost", 8, bound_s=ACK_BOUND) == "fallback"
    assert fleet.side.stats.nack_missing == 1
    assert fleet.stats.pulls_failed == 1
    assert fleet.forgotten("ghost") and fleet.stats.stale_records_forgotten == 1
    fleet.side.assert_clean()


def test_an_entry_evicted_between_lookup_and_read_falls_back(world) -> None:
    producer = world["producer"]()  # 256 rows: a second 200-row item evicts the first
    fleet = FleetConsumer(world["consumer"]())
    assert producer.call("store", key="img-a", rows=200)["stored"]
    fleet.learn(producer, "img-a", 200)
    assert producer.call("store", key="img-b", rows=200)["stored"]  # evicts img-a; its event is late
    assert "img-a" not in producer.state()["entries"]
    assert fleet.fetch("img-a", 200, bound_s=ACK_BOUND) == "fallback"
    assert fleet.side.stats.nack_missing == 1 and fleet.stats.pulls_failed == 1
    assert fleet.forgotten("img-a")
    fleet.side.assert_clean()


def test_a_peer_killed_before_the_pull_costs_a_local_encode_within_the_ack_bound(world) -> None:
    producer = world["producer"]()
    fleet = FleetConsumer(world["consumer"]())
    assert producer.call("store", key="img-a", rows=16)["stored"]
    fleet.learn(producer, "img-a", 16)
    producer.kill()  # the feed's disconnect has not reached the directory yet
    started = time.monotonic()
    assert fleet.fetch("img-a", 16, bound_s=ACK_BOUND) == "fallback"
    assert time.monotonic() - started < ACK_BOUND + SLACK_S
    assert fleet.stats.pulls_failed == 1 and fleet.forgotten("img-a")
    fleet.side.assert_clean()
