"""P2P flows of the producer desk and the consumer fetcher, over the in-memory adapters."""

from __future__ import annotations

import pytest

from ec_connector.adapters.memory import (
    ManualClock,
    MemoryControlClient,
    MemoryControlServer,
    MemoryNetwork,
    MemoryPeerTransport,
    MemoryPeerWorld,
)
from ec_connector.application.consumer import ConsumerFetcher, WantedItem
from ec_connector.application.producer import ProducerDesk
from ec_connector.application.stats import PeerStats
from ec_connector.domain.config import Role
from ec_connector.domain.entries import Phase
from ec_connector.domain.protocol import PROTOCOL_VERSION, AckStatus, XferAck
from ec_connector.domain.publish import PeerAddress
from ec_connector.domain.transfers import EventKind

from .conftest import Engine, encoder_output

FP = "fingerprint-a"
ADDR = PeerAddress("10.0.0.1", 5601)
META = {"image_grid_thw": [1, 4, 4]}


class Pair:
    """A producer engine and a consumer engine joined by in-memory control and data planes."""

    def __init__(
        self,
        *,
        producer_hold: bool = False,
        consumer_fp: str = FP,
        producer_role: Role = Role.PRODUCER,
        **config: object,
    ) -> None:
        self.clock = ManualClock(100.0)
        self.world = MemoryPeerWorld()
        self.net = MemoryNetwork()
        self.producer = Engine(role=producer_role, clock=self.clock, hold=producer_hold, **config)
        self.producer_transport = MemoryPeerTransport(self.world, "prod", self.producer.region)
        self.producer_stats = PeerStats()
        self.desk = self._desk(self.producer_transport)
        self.server = MemoryControlServer(self.net, ADDR)
        self.server.start(self.desk.answer, self.desk.done)
        self.consumer = Engine(role=Role.CONSUMER, clock=self.clock, **config)
        self.consumer_stats = PeerStats()
        self.fetcher = ConsumerFetcher(
            tier=self.consumer.scheduler,
            config=self.consumer.config,
            clock=self.clock,
            control=MemoryControlClient(self.net),
            transport=MemoryPeerTransport(self.world, "cons", self.consumer.region),
            fingerprint=consumer_fp,
            engine_id="cons",
            stats=self.consumer_stats,
        )

    def _desk(self, transport: MemoryPeerTransport) -> ProducerDesk:
        return ProducerDesk(
            tier=self.producer.scheduler,
            config=self.producer.config,
            clock=self.clock,
            fingerprint=FP,
            address=ADDR,
            agent_name=transport.agent_name,
            agent_metadata=transport.agent_metadata(),
            stats=self.producer_stats,
        )

    def produce(self, items: list[tuple[str, int]], *, settle: bool = True) -> dict:
        self.producer.step(items)
        if settle:
            self.producer.settle()
        return self.desk.publish({key: META for key, _ in items})

    def fetch(
        self, params: dict, items: list[tuple[str, int]], *, request_id: str = "r1", media: bool = True
    ) -> bool:
        self.fetcher.poll()
        wanted = [WantedItem(key, rows, media) for key, rows in items]
        return self.fetcher.ensure_available(request_id, params, wanted)

    def run_until_available(self, params: dict, items, *, steps: int = 10, **kw) -> bool:
        for _ in range(steps):
            if self.fetch(params, items, **kw):
                return True
            self.clock.advance(0.1)
        return False


def test_announced_item_is_read_into_the_consumer_tier_and_loads_from_there():
    pair = Pair()
    params = pair.produce([("img", 6)])
    assert params["img"]["metadata"] == META and params["img"]["peer_port"] == ADDR.port
    assert params["img"]["size_bytes"] == 6 * pair.producer.layout.block_size_bytes
    assert pair.fetch(params, [("img", 6)]) is False, "deferred while the transfer runs"
    assert pair.run_until_available(params, [("img", 6)])
    assert pair.consumer.scheduler.is_ready("img")
    result = pair.consumer.step([("img", 6)])
    assert result.loaded["img"] == encoder_output("img", 6)
    assert result.encoded == []
    producer_entry = pair.producer.scheduler.entry("img")
    assert producer_entry.grants == {}, "the XferDone released the producer's pin"
    assert (
        pair.consumer_stats.reads_done == 1 and pair.consumer_stats.bytes_read == params["img"]["size_bytes"]
    )
    assert [e.kind for e in pair.producer.events.events] == [EventKind.STORED, EventKind.ANNOUNCED]


def test_items_the_producer_cannot_serve_are_published_without_address():
    pair = Pair(num_blocks=8)
    params = pair.produce([("small", 2), ("huge", 20)])
    assert params["huge"] == {"metadata": {}}
    assert set(params["small"]) == {"metadata", "peer_host", "peer_port", "size_bytes"}
    assert pair.fetch(params, [("huge", 20)]) is True, "no address: encode locally at once"
    assert pair.consumer_stats.requests_sent == 0


@pytest.mark.parametrize(("role", "held"), [(Role.PRODUCER, True), (Role.BOTH, False)])
def test_a_published_entry_is_held_on_a_producer_and_stays_in_the_eviction_order_on_ec_both(role, held):
    pair = Pair(producer_role=role, num_blocks=8)
    params = pair.produce([("first", 4)])
    assert set(params["first"]) == {"metadata", "peer_host", "peer_port", "size_bytes"}
    pair.produce([("second", 4)])
    third = pair.produce([("third", 4)])  # needs the blocks of one of the two published before
    assert pair.producer.scheduler.holds("first") is held
    assert (third["third"] == {"metadata": {}}) is held, "a producer holding both has no room for a third"
    assert pair.producer_stats.announced == 3 - held


def test_a_pull_the_region_had_no_room_for_is_tried_again_once_there_is_room():
    pair = Pair(num_blocks=8)
    params = pair.produce([("img", 6)])
    blocker = pair.consumer.scheduler.reserve_fetch("blocker", 4, now=pair.clock.now(), lease_s=60.0)
    assert blocker is not None
    assert pair.fetch(params, [("img", 6)]) is True, "no room: encode here"
    assert pair.consumer_stats.fallbacks == 1 and pair.consumer_stats.requests_sent == 0
    pair.consumer.scheduler.fail_fetch("blocker", now=pair.clock.now())
    assert pair.fetch(params, [("img", 6)], request_id="r2") is False, "room now: pulled"
    assert pair.run_until_available(params, [("img", 6)], request_id="r2")
    assert pair.consumer_stats.requests_sent == 1 and pair.consumer_stats.reads_done == 1


def _answering(pair: Pair, status: AckStatus) -> None:
    pair.server.close()
    MemoryControlServer(pair.net, ADDR).start(
        lambda req: XferAck(PROTOCOL_VERSION, req.mm_hash, status), pair.desk.done
    )


@pytest.mark.parametrize(
    "status",
    [AckStatus.NACK_MISSING, AckStatus.NACK_INCOMPAT, AckStatus.NACK_VERSION, AckStatus.NACK_INTERNAL],
)
def test_every_nack_but_not_ready_falls_back_and_frees_the_reservation(status):
    pair = Pair()
    params = pair.produce([("img", 4)])
    _answering(pair, status)
    assert pair.run_until_available(params, [("img", 4)])
    assert not pair.consumer.scheduler.holds("img")
    assert pair.consumer.scheduler.occupancy().free_blocks == pair.consumer.layout.num_blocks
    assert getattr(pair.consumer_stats, status.value.lower()) == 1
    assert pair.consumer_stats.fallbacks == 1
    assert pair.fetch(params, [("img", 4)]) is True
    assert pair.consumer_stats.requests_sent == 1, "a fallen-back item is not asked again at once"


def test_an_evicted_item_is_answered_missing():
    pair = Pair()
    params = pair.produce([("img", 4)])
    pair.clock.advance(pair.producer.config.announce_hold_s)  # the announcement ends
    pair.producer.step([("other", pair.producer.layout.num_blocks)])  # and a save evicts the item
    assert not pair.producer.scheduler.holds("img") and pair.producer.scheduler.holds("other")
    assert pair.run_until_available(params, [("img", 4)])
    assert pair.consumer_stats.nack_missing == 1


def test_incompatible_consumer_is_refused_by_the_fingerprint():
    pair = Pair(consumer_fp="other-model")
    params = pair.produce([("img", 4)])
    assert pair.run_until_available(params, [("img", 4)])
    assert pair.consumer_stats.nack_incompat == 1 and pair.consumer_stats.reads_done == 0


def test_not_ready_is_retried_with_backoff_keeping_the_reservation():
    pair = Pair(producer_hold=True, not_ready_backoff_s=0.1, not_ready_backoff_max_s=0.4)
    params = pair.produce([("img", 5)], settle=False)
    assert pair.fetch(params, [("img", 5)]) is False
    extents = pair.consumer.scheduler.entry("img").extents
    for _ in range(4):
        pair.clock.advance(0.45)
        assert pair.fetch(params, [("img", 5)]) is False
        assert pair.consumer.scheduler.entry("img").extents == extents
    assert pair.consumer_stats.nack_not_ready >= 2
    pair.producer.settle()
    assert pair.run_until_available(params, [("img", 5)], steps=20)
    assert pair.consumer.scheduler.entry("img").extents == extents
    assert pair.consumer.scheduler.stats.evictions == 0
    assert pair.consumer.step([("img", 5)]).loaded["img"] == encoder_output("img", 5)


def test_not_ready_for_too_long_falls_back():
    pair = Pair(producer_hold=True, not_ready_give_up_s=1.0, not_ready_backoff_s=0.2)
    params = pair.produce([("img", 5)], settle=False)
    for _ in range(12):
        if pair.fetch(params, [("img", 5)]):
            break
        pair.clock.advance(0.25)
    assert pair.fetch(params, [("img", 5)]) is True
    assert not pair.consumer.scheduler.holds("img")
    assert pair.consumer_stats.fallbacks == 1


def test_ack_timeout_falls_back_within_the_bound():
    pair = Pair(consumer_ack_timeout_s=2.0)
    params = pair.produce([("img", 4)])
    pair.net.silenced.add(ADDR)
    assert pair.fetch(params, [("img", 4)]) is False
    pair.clock.advance(1.99)
    assert pair.fetch(params, [("img", 4)]) is False
    pair.clock.advance(0.02)
    assert pair.fetch(params, [("img", 4)]) is True
    assert pair.consumer_stats.ack_timeouts == 1
    assert not pair.consumer.scheduler.holds("img")


def test_read_timeout_quarantines_the_blocks_until_it_settles():
    pair = Pair(read_timeout_s=20.0, quarantine_s=60.0)
    params = pair.produce([("img", 4)])
    pair.world.stalled.add("prod")
    assert pair.fetch(params, [("img", 4)]) is False  # asks
    assert pair.fetch(params, [("img", 4)]) is False  # the ack arrives: the READ starts
    pair.clock.advance(19.9)
    assert pair.fetch(params, [("img", 4)]) is False
    pair.clock.advance(0.2)
    assert pair.fetch(params, [("img", 4)]) is True
    entry = pair.consumer.scheduler.entry("img")
    assert entry.phase is Phase.QUARANTINED
    assert pair.consumer_stats.read_timeouts == 1
    # blocks are not reused while the DMA may still write them
    pair.consumer.step([("other", pair.consumer.layout.num_blocks)])
    assert not pair.consumer.scheduler.holds("other")
    assert pair.consumer.scheduler.entry("img").extents == entry.extents
    pair.clock.advance(60.0)
    pair.consumer.scheduler.poll()
    assert not pair.consumer.scheduler.holds("img")
    assert pair.consumer.scheduler.occupancy().free_blocks == pair.consumer.layout.num_blocks


def test_producer_gone_before_the_ack_falls_back_at_once():
    pair = Pair()
    params = pair.produce([("img", 4)])
    pair.server.close()
    assert pair.run_until_available(params, [("img", 4)])
    assert pair.consumer_stats.peers_lost == 1


def test_producer_dying_during_the_read_fails_it_and_quarantines():
    pair = Pair()
    params = pair.produce([("img", 4)])
    pair.world.stalled.add("prod")
    assert pair.fetch(params, [("img", 4)]) is False  # asks
    assert pair.fetch(params, [("img", 4)]) is False  # the READ starts
    pair.world.kill("prod")
    assert pair.fetch(params, [("img", 4)]) is True
    assert pair.consumer_stats.reads_failed == 1
    assert pair.consumer.scheduler.entry("img").phase is Phase.QUARANTINED


def test_control_connection_lost_during_a_stalled_read_gives_it_up_before_the_read_timeout():
    pair = Pair(read_timeout_s=20.0, quarantine_s=60.0)
    params = pair.produce([("img", 4)])
    pair.world.stalled.add("prod")  # the READ hangs, as on a SIGSTOPped producer
    assert pair.fetch(params, [("img", 4)]) is False  # asks
    assert pair.fetch(params, [("img", 4)]) is False  # the ack arrives: the READ starts
    pair.clock.advance(1.0)
    pair.net.disconnect(ADDR)  # heartbeats unanswered: the control connection is reported lost
    assert pair.fetch(params, [("img", 4)]) is True  # fell back, 19 s before the read timeout
    assert pair.consumer_stats.peers_lost == 1 and pair.consumer_stats.read_timeouts == 0
    assert pair.consumer.scheduler.entry("img").phase is Phase.QUARANTINED  # a DMA may land


def _restart_producer(pair: Pair, agent: str, *, kill: bool = True) -> MemoryPeerTransport:
    """Kill the producer and start a new one (new agent named `agent`, empty cache) at ADDR."""
    if kill:
        pair.world.kill("prod")
    pair.producer = Engine(role=Role.PRODUCER, clock=pair.clock)
    transport = MemoryPeerTransport(pair.world, agent, pair.producer.region)
    pair.server.close()
    pair.desk = pair._desk(transport)
    MemoryControlServer(pair.net, ADDR).start(pair.desk.answer, pair.desk.done)
    return transport


@pytest.mark.parametrize(
    "agent",
    [
        pytest.param("prod@2", id="new agent name (as the container names each start)"),
        pytest.param("prod", id="same agent name, new metadata"),
    ],
)
def test_restarted_producer_is_read_with_the_agent_its_ack_carries_and_the_old_agent_is_removed(agent):
    pair = Pair()
    first = pair.produce([("a", 3)])
    assert pair.run_until_available(first, [("a", 3)])
    old_metadata = pair.producer_transport.agent_metadata()
    assert _restart_producer(pair, agent).agent_metadata() != old_metadata
    second = pair.produce([("b", 4)])
    assert pair.run_until_available(second, [("b", 4)])
    assert pair.consumer.step([("b", 4)]).loaded["b"] == encoder_output("b", 4)
    consumer_transport = pair.fetcher._transport
    assert consumer_transport.peers == {agent: pair.desk._agent_metadata}, "the old agent is gone"
    assert pair.consumer_stats.agents_replaced == (agent != "prod")


def test_a_read_still_pending_from_a_replaced_agent_fails_and_its_blocks_are_quarantined():
    pair = Pair()
    pair.world.stalled.add("prod")  # the READ hangs, and the old agent is never seen to die
    params = pair.produce([("img", 4)])
    assert pair.fetch(params, [("img", 4)]) is False  # asks
    assert pair.fetch(params, [("img", 4)]) is False  # the ack arrives: the READ starts
    assert pair.fetch(params, [("img", 4)]) is False  # still reading
    _restart_producer(pair, "prod@2", kill=False)  # acks the next item with its new agent
    again = pair.produce([("b", 2)])
    assert pair.run_until_available(again, [("b", 2)])
    assert pair.run_until_available(params, [("img", 4)])  # the old READ failed: fell back
    assert pair.consumer_stats.reads_failed == 1 and pair.consumer_stats.read_timeouts == 0
    assert pair.consumer.scheduler.entry("img").phase is Phase.QUARANTINED  # a DMA may land


def test_request_whose_media_is_gone_fails_cleanly_when_the_item_cannot_be_fetched():
    pair = Pair()
    params = pair.produce([("img", 4)])
    pair.net.silenced.add(ADDR)
    assert pair.fetch(params, [("img", 4)], request_id="r-meta", media=False) is False
    pair.clock.advance(3.0)
    # never schedulable (its encoder would get no input): deferred until the engine fails it
    assert pair.fetch(params, [("img", 4)], request_id="r-meta", media=False) is False
    assert pair.fetcher.take_unavailable() == {"r-meta"}
    assert pair.fetcher.take_unavailable() == set()


def test_malformed_params_are_counted_and_the_item_encoded_locally():
    pair = Pair()
    params = {"img": {"metadata": META, "peer_host": "h"}}  # half an address
    assert pair.fetch(params, [("img", 4)]) is True
    assert pair.consumer_stats.bad_params == 1 and pair.consumer_stats.requests_sent == 0


def test_an_unread_grant_is_released_when_its_lease_lapses():
    pair = Pair(producer_pin_lease_s=30.0, announce_lease_s=10.0)
    params = pair.produce([("img", 4)])
    pair.world.stalled.add("prod")
    pair.fetch(params, [("img", 4)])
    pair.fetch(params, [("img", 4)])
    assert pair.producer.scheduler.entry("img").is_pinned
    pair.clock.advance(30.0)
    pair.producer.scheduler.poll()
    entry = pair.producer.scheduler.entry("img")
    assert not entry.is_pinned and entry.is_evictable(pair.clock.now())
    assert pair.producer.scheduler.stats.grants_lapsed == 1


def test_a_late_ack_releases_the_grant_it_carries():
    pair = Pair(consumer_ack_timeout_s=1.0)
    params = pair.produce([("img", 4)])
    pair.net.silenced.add(ADDR)
    pair.fetch(params, [("img", 4)])
    pair.clock.advance(1.5)
    assert pair.fetch(params, [("img", 4)]) is True  # timed out: encode locally
    pair.net.silenced.clear()
    late = pair.desk.answer(pair.net.sent[0][1])
    pair.fetcher._on_ack(ADDR, late, pair.clock.now())
    assert pair.consumer_stats.late_acks == 1
    assert pair.producer.scheduler.entry("img").grants == {}


def test_a_save_that_landed_while_the_producer_engine_was_idle_is_served_without_another_step():
    pair = Pair()
    pair.producer.step([("img", 4)])
    for copier, worker in zip(pair.producer.copiers, pair.producer.workers, strict=True):
        copier.release_held()
        worker.flush()  # the completion is in the region; the producer's scheduler has not polled
    params = pair.desk.publish({"img": META})
    assert pair.run_until_available(params, [("img", 4)])
    assert pair.consumer_stats.nack_not_ready == 0 and pair.consumer_stats.reads_done == 1


def test_a_fetch_never_evicts_an_item_promised_to_vllm_this_step():
    pair = Pair(num_blocks=8)
    first = pair.produce([("first", 6)])
    assert pair.run_until_available(first, [("first", 6)])
    second = pair.produce([("second", 6)])  # the producer evicts "first" for it; we hold our copy
    pair.consumer.scheduler.take_plan()  # a new step
    assert pair.consumer.scheduler.has_item("first"), "vLLM is told it can load 'first' this step"
    assert pair.fetch(second, [("second", 6)]) is True, "no room without evicting 'first': encode"
    assert pair.consumer.scheduler.is_ready("first")
    assert pair.consumer_stats.fallbacks == 1
    result = pair.consumer.step([("first", 6)])
    assert result.loaded["first"] == encoder_output("first", 6)


def test_a_ready_item_a_request_has_no_media_for_is_kept_until_vllm_asks_for_it():
    pair = Pair(num_blocks=8)
    first = pair.produce([("first", 6)])
    assert pair.run_until_available(first, [("first", 6)])
    second = pair.produce([("second", 6)])
    pair.consumer.scheduler.take_plan()  # a new step
    # a request whose media were stripped (its item is in the tier) is admitted...
    assert pair.fetch({}, [("first", 6)], request_id="r-meta", media=False) is True
    # ...and before vLLM asks for its item, another request's fetch would need that item's room
    assert pair.fetch(second, [("second", 6)], request_id="r2") is True, "no room: encode 'second'"
    assert pair.consumer_stats.fallbacks == 1
    assert pair.consumer.scheduler.has_item("first")
    assert pair.consumer.step([("first", 6)]).loaded["first"] == encoder_output("first", 6)
