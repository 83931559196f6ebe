"""Fault injection on real components: a producer process (composition root, /dev/shm region, NIXL
agent, ZMQ ROUTER + producer desk) and a consumer in this process (real region, NIXL agent, ZMQ
DEALER, fetcher). Each fault ends with the item read or cleanly fallen back within its bound, and
with nothing pinned, no block lost, no /dev/shm file left and no descriptor or thread leaked
(`ConsumerSide.assert_clean` and the `world` fixture).
"""

from __future__ import annotations

import time

from .conftest import CONSUMER_EXTRA, ConsumerSide, needs_nixl

pytestmark = needs_nixl

ACK_BOUND = CONSUMER_EXTRA["consumer_ack_timeout_s"]
READ_BOUND = ACK_BOUND + CONSUMER_EXTRA["read_timeout_s"]
NOT_READY_BOUND = (
    CONSUMER_EXTRA["not_ready_give_up_s"] + CONSUMER_EXTRA["not_ready_backoff_max_s"] + ACK_BOUND
)


def assert_producer_clean(producer) -> dict:
    state = producer.state()
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
    deadline = time.monotonic() + 5
    while producer.state()["grants"] and time.monotonic() < deadline:
        time.sleep(0.01)  # the XferDone travels after the READ
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
