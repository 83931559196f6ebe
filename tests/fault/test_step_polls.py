"""When the scheduler side polls its supply (`StepPolls`), on a real producer process and a real
consumer (ZMQ, NIXL, /dev/shm): the ack of an ask made while a step was scheduled is handled at
that step's end, so the READ is already posted when the next step starts and the request is
scheduled one step after its ask."""

from __future__ import annotations

import time

import pytest

from ec_connector.application.consumer import WantedItem
from ec_connector.application.roles import StepPolls

from .harness import HAVE_NIXL, NO_NIXL, ConsumerSide

pytestmark = pytest.mark.skipif(not HAVE_NIXL, reason=NO_NIXL)

# Each far longer than what it stands for (an ack takes under a millisecond, a 3 KiB READ less), so a
# loaded 2-core machine still fits the ack in the asking step and the READ in the forward.
ACK_WAIT_S = 0.5  # the rest of the asking step's scheduling
FORWARD_S = 0.5  # the model's forward


def test_an_ask_is_acked_at_the_end_of_its_step_and_ready_at_the_next(world) -> None:
    producer = world["producer"]()
    consumer: ConsumerSide = world["consumer"](extra={"nixl_consumer_progress_thread": True})
    params = producer.store("img-a", 24)
    polls = StepPolls(consumer.fetcher)
    wanted = [WantedItem("img-a", 24, True)]

    polls.step_started()
    assert not consumer.fetcher.ensure_available("req-1", params, wanted)  # asked, deferred
    consumer.scheduler.take_plan()
    time.sleep(ACK_WAIT_S)
    assert consumer.stats.acks_ok == 0  # nothing polled since the ask
    polls.step_ended()
    assert consumer.stats.acks_ok == 1  # the ack was handled in the asking step: READ posted

    time.sleep(FORWARD_S)  # the model's forward, during which the READ lands
    polls.step_started()
    assert consumer.fetcher.ensure_available("req-1", params, wanted)  # the next step schedules it
    assert consumer.stats.reads_done == 1 and consumer.stats.fallbacks == 0
    consumer.assert_read("img-a", 24)
    consumer.assert_clean()

