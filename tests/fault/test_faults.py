"""Fault injection on real components: a producer process (composition root, /dev/shm region, NIXL
agent, ZMQ ROUTER + producer desk) and a consumer in this process (real region, NIXL agent, ZMQ
DEALER, fetcher). Each fault ends with the item read or cleanly fallen back within its bound, and
with nothing pinned, no block lost, no /dev/shm file left and no descriptor or thread leaked
(`ConsumerSide.assert_clean` and the `world` fixture).
"""

from __future__ import annotations

import signal
import time

import pytest

from ec_connector.adapters.zmq_control import Heartbeat

from .harness import CONSUMER_EXTRA, HAVE_NIXL, NO_NIXL, ConsumerSide

pytestmark = pytest.mark.skipif(not HAVE_NIXL, reason=NO_NIXL)

ACK_BOUND = CONSUMER_EXTRA["consumer_ack_timeout_s"]
READ_BOUND = ACK_BOUND + CONSUMER_EXTRA["read_timeout_s"]
NOT_READY_BOUND = (
    CONSUMER_EXTRA["not_ready_give_up_s"] + CONSUMER_EXTRA["not_ready_backoff_max_s"] + ACK_BOUND
)


def assert_producer_clean(producer, bound_s: float = 10.0) -> dict:
    """No grant or pin left on the producer (an XferDone travels after its READ: wait for it)."""
    deadline = time.monotonic() + bound_s
    while (state := producer.state())["pinned"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state["pinned"] == 0 and state["grants"] == 0, state
    return state


def test_an_announced_item_is_read_byte_exact_and_every_pin_is_released(world) -> None:
    producer = world["producer"]()
    consumer: ConsumerSide = world["consumer"]()
    params = producer.store("img-a", 24)
    assert params["img-a"]["peer_port"] == producer.port
    assert consumer.fetch(params, [("img-a", 24)], bound_s=READ_BOUND) == {"img-a": "read"}
    consumer.assert_read("img-a", 24)
    assert consumer.stats.reads_done == 1 and consumer.stats.fallbacks == 0
    consumer.assert_clean()
    assert_producer_clean(producer)


def test_nack_missing_an_item_the_producer_does_not_hold_falls_back(world) -> None:
    producer = world["producer"]()
    consumer = world["consumer"]()
    params = producer.store("img-a", 8)
    forged = {"ghost": {**params["img-a"]}}  # an address for an item never stored there
    assert consumer.fetch(forged, [("ghost", 8)], bound_s=ACK_BOUND) == {"ghost": "fallback"}
    assert consumer.stats.nack_missing == 1
    consumer.assert_clean()
    assert_producer_clean(producer)


def test_nack_incompat_a_consumer_of_another_model_falls_back(world) -> None:
    producer = world["producer"]()
    consumer = world["consumer"](fingerprint="another-model")
    params = producer.store("img-a", 8)
    assert consumer.fetch(params, [("img-a", 8)], bound_s=ACK_BOUND) == {"img-a": "fallback"}
    assert consumer.stats.nack_incompat == 1
    consumer.assert_clean()
    assert_producer_clean(producer)


def test_nack_version_a_consumer_of_another_protocol_version_falls_back(world, monkeypatch) -> None:
    producer = world["producer"]()
    consumer = world["consumer"]()
    params = producer.store("img-a", 8)
    monkeypatch.setattr("ec_connector.application.consumer.PROTOCOL_VERSION", 2)  # a newer consumer
    assert consumer.fetch(params, [("img-a", 8)], bound_s=ACK_BOUND) == {"img-a": "fallback"}
    assert consumer.stats.nack_version == 1
    consumer.assert_clean()
    assert_producer_clean(producer)


@pytest.mark.fault_long
def test_nack_internal_an_entry_too_fragmented_for_one_ack_is_not_announced_nor_left_pinned(world) -> None:
    # 2 x 4097 one-row entries, every second one announced (so not evictable): the next 4097-row
    # entry evicts the others and is spread over 4097 runs, more than an ack may carry.
    blocks = 2 * 4097
    producer = world["producer"](cpu_bytes=blocks * 128)
    consumer = world["consumer"](blocks=4200)
    keys = [f"{kind}-{i}" for i in range(4097) for kind in ("keep", "hole")]
    for at in range(0, len(keys), 2000):  # steps of at most 2000 saves (the completion ring holds 4096)
        chunk = keys[at : at + 2000]
        assert producer.call("step", keys=chunk, rows=1, fail=[]) == {"ready": len(chunk)}
    producer.call("publish", keys=keys[0::2])
    assert producer.call("store", key="frag", rows=4097)["stored"]
    assert producer.state()["runs"] == {"frag": 4097}
    assert producer.call("publish", keys=["frag"]) == {"frag": {"metadata": {}}}, "both halves or neither"
    forged = {"frag": {**producer.call("publish", keys=["keep-0"])["keep-0"], "size_bytes": 4097 * 128}}
    assert consumer.fetch(forged, [("frag", 4097)], bound_s=ACK_BOUND) == {"frag": "fallback"}
    assert consumer.stats.nack_internal == 1
    consumer.assert_clean()
    assert_producer_clean(producer)


# -- a slow producer: NACK_NOT_READY ------------------------------------------------------------


def test_a_save_that_never_lands_is_retried_with_backoff_then_given_up(world) -> None:
    producer = world["producer"]()
    consumer = world["consumer"]()
    assert producer.call("reserve", key="slow", rows=8)["reserved"]
    params = producer.call("publish", keys=["slow"])
    assert consumer.fetch(params, [("slow", 8)], bound_s=NOT_READY_BOUND) == {"slow": "fallback"}
    # each ask held up to 0.25 s by the producer (NOT_READY_HOLD_S), then backoff 0.05 s doubling
    # to 0.4 s, over a 1.5 s give-up: a handful of asks (5 on an idle machine), not a storm
    assert 3 <= consumer.stats.nack_not_ready <= 12, consumer.stats
    assert consumer.stats.requests_sent == consumer.stats.nack_not_ready
    consumer.assert_clean()
    assert_producer_clean(producer)
    producer.call("land", key="slow")


def test_a_save_that_lands_during_the_retries_is_read_into_the_same_reservation(world) -> None:
    producer = world["producer"]()
    consumer = world["consumer"]()
    assert producer.call("reserve", key="late", rows=8)["reserved"]
    params = producer.call("publish", keys=["late"])
    first: list = []

    def land_after_two_nacks(side: ConsumerSide) -> None:
        entry = side.scheduler.entry("late")
        if entry is not None and not first:
            first.append(entry.extents)
        if side.stats.nack_not_ready == 2 and len(first) == 1:
            first.append("landed")
            producer.call("land", key="late")

    outcome = consumer.fetch(params, [("late", 8)], bound_s=NOT_READY_BOUND, on_step=land_after_two_nacks)
    assert outcome == {"late": "read"}
    assert consumer.scheduler.entry("late").extents == first[0], "the reservation was kept across retries"
    consumer.assert_read("late", 8)
    consumer.assert_clean()


# -- a producer that stops answering, stalls or dies --------------------------------------------


def test_ack_timeout_a_stopped_producer_costs_the_ack_bound_and_its_late_grant_is_returned(world) -> None:
    producer = world["producer"]()
    consumer = world["consumer"]()
    params = producer.store("img-a", 8)
    producer.signal(signal.SIGSTOP)
    started = time.monotonic()
    assert consumer.fetch(params, [("img-a", 8)], bound_s=ACK_BOUND) == {"img-a": "fallback"}
    assert time.monotonic() - started >= ACK_BOUND
    assert consumer.stats.ack_timeouts == 1
    producer.signal(signal.SIGCONT)  # it now answers the stale request: OK, with a grant
    deadline = time.monotonic() + 10
    # Poll until the late ack has arrived (the producer may not have read the stale request yet
    # when it first reports its state) and has been answered with an XferDone.
    while not consumer.stats.late_acks and time.monotonic() < deadline:
        consumer.fetcher.poll()
        time.sleep(0.01)
    assert consumer.stats.late_acks == 1, "the stopped producer never answered the stale request"
    consumer.assert_clean()
    assert_producer_clean(producer)


class StopAfterAck:
    """Wraps the consumer's real control client: sends `sig` to the producer when an OK ack
    arrives, before the fetcher sees it, so the READ is posted to a frozen or dead producer."""

    def __init__(self, consumer: ConsumerSide, producer, sig: int) -> None:
        self._inner, self._producer, self._sig = consumer.control, producer, sig
        self.fired = False
        consumer.fetcher._control = self

    def send(self, address, message) -> None:
        self._inner.send(address, message)

    def poll(self):
        replies = self._inner.poll()
        if not self.fired and any(r.ack is not None and r.ack.status.value == "OK" for r in replies):
            self.fired = True
            self._producer.signal(self._sig)
        return replies

    def wait(self, timeout_s: float) -> bool:
        return self._inner.wait(timeout_s)

    def close(self) -> None:
        self._inner.close()


@pytest.fixture
def tcp_only(monkeypatch) -> dict[str, str]:
    """UCX over TCP only (both ends): a READ then needs the producer's progress to complete."""
    monkeypatch.setenv("UCX_TLS", "tcp,self")
    return {"UCX_TLS": "tcp,self"}


def test_read_timeout_a_producer_frozen_after_its_ack_is_given_up_and_the_blocks_quarantined(
    world, tcp_only
) -> None:
    producer = world["producer"](env=tcp_only)
    consumer = world["consumer"]()
    params = producer.store("img-a", 64)
    hook = StopAfterAck(consumer, producer, signal.SIGSTOP)
    started = time.monotonic()
    assert consumer.fetch(params, [("img-a", 64)], bound_s=READ_BOUND) == {"img-a": "fallback"}
    assert hook.fired and time.monotonic() - started >= CONSUMER_EXTRA["read_timeout_s"]
    assert consumer.stats.read_timeouts == 1
    entry = consumer.scheduler.entry("img-a")
    assert entry is not None and entry.phase.value == "quarantined", "a DMA may still land there"
    producer.signal(signal.SIGCONT)
    consumer.assert_clean()  # the quarantine ends after quarantine_s
    assert_producer_clean(producer)


def test_a_frozen_producer_whose_heartbeats_stop_is_given_up_before_the_read_timeout(world, tcp_only) -> None:
    producer = world["producer"](env=tcp_only)
    beat = Heartbeat(ivl_s=0.2, timeout_s=0.6, ttl_s=1.0)
    consumer = world["consumer"](heartbeat=beat, extra={"read_timeout_s": 30.0})
    params = producer.store("img-a", 64)
    hook = StopAfterAck(consumer, producer, signal.SIGSTOP)
    started = time.monotonic()
    assert consumer.fetch(params, [("img-a", 64)], bound_s=10.0) == {"img-a": "fallback"}
    took = time.monotonic() - started
    assert hook.fired and took < 10.0, f"gave up after {took:.1f} s; the READ timeout is 30 s"
    assert consumer.stats.peers_lost == 1 and consumer.stats.read_timeouts == 0
    entry = consumer.scheduler.entry("img-a")
    assert entry is not None and entry.phase.value == "quarantined", "a DMA may still land there"
    producer.signal(signal.SIGCONT)
    consumer.assert_clean()
    assert_producer_clean(producer)


@pytest.mark.parametrize("mode", ["none", "peer"])
def test_a_producer_killed_mid_read_falls_back_within_the_read_bound(world, tcp_only, mode) -> None:
    producer = world["producer"](env=tcp_only, extra={"ucx_error_mode": mode})
    consumer = world["consumer"](ucx_error_mode=mode)
    params = producer.store("img-a", 64)
    hook = StopAfterAck(consumer, producer, signal.SIGSTOP)  # the READ is posted to a frozen peer
    killed: list[float] = []

    def kill_once_reading(side: ConsumerSide) -> None:
        if hook.fired and not killed and side.stats.acks_ok == 1:
            producer.kill()
            killed.append(time.monotonic())

    outcome = consumer.fetch(params, [("img-a", 64)], bound_s=READ_BOUND, on_step=kill_once_reading)
    assert killed and outcome == {"img-a": "fallback"}
    # whichever the consumer sees first ends the READ: UCX failing it, its deadline, or the killed
    # process's control socket closing (peer lost)
    stats = consumer.stats
    assert stats.reads_failed + stats.read_timeouts + stats.peers_lost == 1
    consumer.assert_clean()


def test_a_restarted_producer_answers_missing_for_old_items_and_is_read_with_its_new_agent(world) -> None:
    first = world["producer"]("prod-restart")
    consumer = world["consumer"]()
    old = first.store("old", 8)
    assert consumer.fetch(old, [("old", 8)], bound_s=READ_BOUND) == {"old": "read"}
    first.kill()
    second = world["producer"]("prod-restart", port=first.port)  # same engine_id and address
    again = {"old2": {**old["old"]}}  # params issued by the dead producer
    assert consumer.fetch(again, [("old2", 8)], bound_s=ACK_BOUND + 5) == {"old2": "fallback"}
    new = second.store("new", 16)
    assert consumer.fetch(new, [("new", 16)], bound_s=READ_BOUND) == {"new": "read"}
    consumer.assert_read("new", 16)
    # each start names its agent anew; the consumer removed the dead one from every lane
    assert second.agent != first.agent and second.agent.split("@")[0] == first.agent.split("@")[0]
    assert consumer.transport.peers == [second.agent]
    assert consumer.stats.nack_missing + consumer.stats.peers_lost == 1
    consumer.assert_clean()
    assert_producer_clean(second)


# -- full regions, eviction ---------------------------------------------------------------------


def test_a_full_region_on_either_end_means_local_encoding_at_once(world) -> None:
    producer = world["producer"](cpu_bytes=32 * 128)
    consumer = world["consumer"](blocks=16)
    assert producer.call("store", key="huge", rows=40) == {"stored": False}
    assert producer.call("publish", keys=["huge"]) == {"huge": {"metadata": {}}}
    assert consumer.fetch({"huge": {"metadata": {}}}, [("huge", 40)], bound_s=0) == {"huge": "fallback"}
    params = producer.store("wide", 24)
    assert consumer.fetch(params, [("wide", 24)], bound_s=0) == {"wide": "fallback"}
    assert consumer.stats.requests_sent == 0 and consumer.stats.fallbacks == 1
    consumer.assert_clean()
    assert_producer_clean(producer)


def test_an_item_evicted_after_its_announcement_ended_is_answered_missing(world) -> None:
    producer = world["producer"](cpu_bytes=32 * 128, extra={"announce_lease_s": 0.2})
    consumer = world["consumer"]()
    params = producer.store("first", 16)
    time.sleep(0.3)
    producer.call("poll")
    producer.store("second", 16)
    producer.store("third", 16)  # needs first's blocks: the announcement is over, so it goes
    assert "first" not in producer.state()["entries"]
    assert consumer.fetch(params, [("first", 16)], bound_s=ACK_BOUND) == {"first": "fallback"}
    assert consumer.stats.nack_missing == 1
    consumer.assert_clean()
    assert_producer_clean(producer)


# -- hostile traffic at the producer's ROUTER port ----------------------------------------------


def test_hostile_frames_and_unauthenticated_peers_are_dropped_and_real_requests_still_served(world) -> None:
    import msgspec
    import zmq

    from ec_connector.adapters.zmq_control import MAX_FRAME_BYTES, FrameAuth
    from ec_connector.adapters.zmq_control.auth import REQUEST
    from ec_connector.adapters.zmq_control.codec import decode_ack, encode
    from ec_connector.domain.protocol import PROTOCOL_VERSION, AckStatus, XferReq

    producer = world["producer"](secret="s3cret")
    trusted = world["consumer"](extra={"side_channel_secret": "s3cret"})
    stranger = world["consumer"]()  # no secret: its requests must not be served
    params = producer.store("img-a", 8)
    good = encode(XferReq(PROTOCOL_VERSION, "img-a", "fp", "raw"))
    other_version = msgspec.msgpack.encode({"version": 7, "msg": {"type": "req", "mm_hash": "img-a"}})
    sealer = FrameAuth("s3cret")

    def sealed(payload: bytes) -> list[bytes]:
        return [payload, sealer.seal(REQUEST, payload)]

    replay = sealed(good)
    hostile = {
        "garbage": sealed(b"\xc1\xc1 not msgpack"),
        "truncated": sealed(good[:-3]),
        "nesting bomb": sealed(b"\x82\xa7version\x01\xa3msg" + b"\x91" * 100_000 + b"\x00"),
        "oversized": sealed(b"\x00" * (MAX_FRAME_BYTES + 1)),
        "unauthenticated": [good],
        "wrong secret": [good, FrameAuth("guess").seal(REQUEST, good)],
        "replayed": replay,  # sent once first, below
    }
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.rcvtimeo = 5000
        sock.connect(f"tcp://127.0.0.1:{producer.port}")
        sock.send_multipart(replay)  # first use: served (fingerprint differs: NACK_INCOMPAT)
        assert decode_ack(sock.recv_multipart()[0]).status is AckStatus.NACK_INCOMPAT
        for parts in hostile.values():
            sock.send_multipart(parts)
        sock.send_multipart(sealed(other_version))  # another version: answered, not dropped
        assert decode_ack(sock.recv_multipart()[0]).status is AckStatus.NACK_VERSION
        cut = ctx.socket(zmq.DEALER)  # a part past ZMQ's hard cap: that connection is cut
        cut.linger = 0
        cut.connect(f"tcp://127.0.0.1:{producer.port}")
        cut.send(b"\x00" * (3 * MAX_FRAME_BYTES))
        assert stranger.fetch(params, [("img-a", 8)], bound_s=ACK_BOUND) == {"img-a": "fallback"}
        assert stranger.stats.ack_timeouts == 1
        assert trusted.fetch(params, [("img-a", 8)], bound_s=READ_BOUND) == {"img-a": "read"}
        trusted.assert_read("img-a", 8)
    finally:
        ctx.destroy(linger=0)
    dropped = producer.state()["dropped"]
    assert dropped["malformed"] == 3 and dropped["oversized"] == 1, dropped
    assert dropped["auth"] == 4, dropped  # unauthenticated, wrong secret, replayed, the stranger
    trusted.assert_clean()
    stranger.assert_clean()
    assert_producer_clean(producer)
