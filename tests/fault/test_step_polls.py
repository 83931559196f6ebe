"""When the scheduler side polls and waits on its supply (`StepPolls`), on a real producer process
and a real consumer (ZMQ, NIXL, /dev/shm): a pull that lands while its step is scheduled (within
`step_pull_wait_s`) has its request scheduled in that step; the ack of an ask made while a step was
scheduled is otherwise handled at that step's end (waiting for it up to `step_ack_wait_s`), so the
READ is already posted when the next step starts and the request is scheduled one step after its
ask; a producer that does not answer costs a step no more than those waits."""

from __future__ import annotations

import signal
import time

import pytest

from ec_connector.application.consumer import WantedItem
from ec_connector.application.roles import StepPolls

from .harness import HAVE_NIXL, NO_NIXL, SLACK_S, ConsumerSide

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


def test_the_step_end_waits_for_the_ack_of_an_ask_made_in_the_step(world) -> None:
    producer = world["producer"]()
    consumer: ConsumerSide = world["consumer"](extra={"nixl_consumer_progress_thread": True})
    params = producer.store("img-a", 24)
    polls = StepPolls(consumer.fetcher, ack_wait_s=ACK_WAIT_S)  # ends as soon as the ack is in
    wanted = [WantedItem("img-a", 24, True)]

    polls.step_started()
    assert not consumer.fetcher.ensure_available("req-1", params, wanted)
    consumer.scheduler.take_plan()
    polls.step_ended()  # at once: no time for the ack unless the step end waits for it
    assert consumer.stats.acks_ok == 1

    time.sleep(FORWARD_S)
    polls.step_started()
    assert consumer.fetcher.ensure_available("req-1", params, wanted)
    consumer.assert_read("img-a", 24)
    consumer.assert_clean()


def test_a_producer_that_does_not_answer_costs_a_step_at_most_the_wait(world) -> None:
    producer = world["producer"]()
    consumer: ConsumerSide = world["consumer"]()
    params = producer.store("img-a", 24)
    producer.signal(signal.SIGSTOP)  # alive, connected, silent
    wait_s = 0.2
    polls = StepPolls(consumer.fetcher, ack_wait_s=wait_s)
    wanted = [WantedItem("img-a", 24, True)]

    polls.step_started()
    assert not consumer.fetcher.ensure_available("req-1", params, wanted)
    consumer.scheduler.take_plan()
    started = time.monotonic()
    polls.step_ended()
    took = time.monotonic() - started
    assert wait_s * 0.9 <= took < wait_s + SLACK_S and consumer.stats.acks_ok == 0
    started = time.monotonic()
    polls.step_started()
    assert not consumer.fetcher.ensure_available("req-1", params, wanted)
    polls.step_ended()  # the ask was made in an earlier step: this step does not wait for it
    assert time.monotonic() - started < wait_s

    producer.signal(signal.SIGCONT)
    assert consumer.fetch(params, [("img-a", 24)], bound_s=ACK_WAIT_S) == {"img-a": "read"}
    consumer.assert_clean()


def test_a_pull_that_lands_within_the_step_wait_is_scheduled_in_its_step(world) -> None:
    producer = world["producer"]()
    consumer: ConsumerSide = world["consumer"](extra={"nixl_consumer_progress_thread": True})
    params = producer.store("img-a", 24)
    polls = StepPolls(consumer.fetcher, pull_wait_s=ACK_WAIT_S)  # ends as soon as the READ is done
    wanted = [WantedItem("img-a", 24, True)]

    started = time.monotonic()
    assert polls.ensure_available("req-1", params, wanted)  # asked, acked, read: schedule it now
    assert time.monotonic() - started < ACK_WAIT_S
    assert consumer.stats.reads_done == 1 and consumer.stats.fallbacks == 0
    consumer.scheduler.take_plan()
    polls.step_ended()
    consumer.assert_read("img-a", 24)
    consumer.assert_clean()


def test_a_silent_producer_costs_a_step_at_most_its_pull_wait(world) -> None:
    producer = world["producer"]()
    consumer: ConsumerSide = world["consumer"]()
    params = producer.store("img-a", 24)
    params_b = producer.store("img-b", 24)
    producer.signal(signal.SIGSTOP)
    wait_s = 0.2
    polls = StepPolls(consumer.fetcher, pull_wait_s=wait_s)

    started = time.monotonic()
    assert not polls.ensure_available("req-1", params, [WantedItem("img-a", 24, True)])
    assert not polls.ensure_available("req-2", params_b, [WantedItem("img-b", 24, True)])
    took = time.monotonic() - started
    assert wait_s * 0.9 <= took < wait_s + SLACK_S  # the second request found the step's wait spent
    consumer.scheduler.take_plan()
    polls.step_ended()
    started = time.monotonic()
    assert not polls.ensure_available("req-1", params, [WantedItem("img-a", 24, True)])
    assert time.monotonic() - started < wait_s  # asks of earlier steps are not waited for

    producer.signal(signal.SIGCONT)
    assert consumer.fetch(params, [("img-a", 24)], bound_s=ACK_WAIT_S) == {"img-a": "read"}
    assert consumer.fetch(params_b, [("img-b", 24)], bound_s=ACK_WAIT_S) == {"img-b": "read"}
    consumer.assert_clean()
