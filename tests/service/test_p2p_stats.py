"""Peer-read latencies, quarantine counts and the consumer's STORED event (issue #6)."""

from __future__ import annotations

from ec_connector.adapters.memory import MemoryControlClient, MemoryPeerTransport
from ec_connector.application.consumer import ConsumerFetcher
from ec_connector.domain.transfers import EventKind
from ec_connector.ports.peer import ReadState

from .test_p2p import FP, Pair


class GatedReads:
    """The memory data plane, with READs reported pending until the test opens the gate."""

    def __init__(self, inner: MemoryPeerTransport) -> None:
        self._inner = inner
        self.open = False

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._inner, name)

    def read_state(self, handle: int) -> ReadState:
        return self._inner.read_state(handle) if self.open else ReadState.PENDING


def test_read_and_fetch_latencies_are_measured_on_the_consumer_clock():
    pair = Pair()
    gate = GatedReads(MemoryPeerTransport(pair.world, "cons-gated", pair.consumer.region))
    pair.fetcher = ConsumerFetcher(
        tier=pair.consumer.scheduler,
        config=pair.consumer.config,
        clock=pair.clock,
        control=MemoryControlClient(pair.net),
        transport=gate,  # type: ignore[arg-type]
        fingerprint=FP,
        engine_id="cons",
        stats=pair.consumer_stats,
    )
    params = pair.produce([("img", 4)])
    assert pair.fetch(params, [("img", 4)]) is False  # asks
    pair.clock.advance(0.5)
    assert pair.fetch(params, [("img", 4)]) is False  # the ack arrives: the READ is posted
    pair.clock.advance(1.25)
    gate.open = True
    assert pair.fetch(params, [("img", 4)]) is True
    assert pair.consumer_stats.latencies.take() == {"peer_read": [1.25], "peer_fetch": [1.75]}
    stored = [e for e in pair.consumer.events.events if e.kind is EventKind.STORED]
    assert [(e.mm_hash, e.size_bytes) for e in stored] == [("img", params["img"]["size_bytes"])]


def test_a_read_timeout_counts_one_quarantine_and_no_read_latency():
    pair = Pair(read_timeout_s=20.0)
    params = pair.produce([("img", 4)])
    pair.world.stalled.add("prod")
    assert pair.fetch(params, [("img", 4)]) is False
    assert pair.fetch(params, [("img", 4)]) is False
    pair.clock.advance(20.1)
    assert pair.fetch(params, [("img", 4)]) is True
    assert pair.consumer_stats.quarantines == 1 and pair.consumer_stats.read_timeouts == 1
    assert pair.consumer_stats.latencies.take() == {}
    assert not [e for e in pair.consumer.events.events if e.kind is EventKind.STORED]
