"""`StepPolls`: when the scheduler side polls its supply within an engine step (the real-parts
check of what the end-of-step poll and its ack wait buy is tests/fault/test_step_polls.py)."""

from __future__ import annotations

from collections.abc import Sequence

from ec_connector.application.consumer import WantedItem
from ec_connector.application.roles import StepPolls


class CountingSupply:
    """A supply that counts its polls and records its ack waits; `pending`: fetches in flight."""

    def __init__(self) -> None:
        self.polls = 0
        self.waits: list[float] = []
        self.pending = False

    def poll(self) -> None:
        self.polls += 1

    def ensure_available(self, request_id: str, params: object, items: Sequence[WantedItem]) -> bool:
        return not self.pending

    def take_unavailable(self) -> set[str]:
        return set()

    def has_pending_work(self) -> bool:
        return self.pending

    def await_acks(self, budget_s: float) -> None:
        self.waits.append(budget_s)


def test_a_step_polls_once_at_its_start_however_many_requests_it_checks() -> None:
    supply = CountingSupply()
    polls = StepPolls(supply, ack_wait_s=0.002)
    for _ in range(3):
        polls.step_started()
    assert supply.polls == 1
    polls.step_ended()  # nothing in flight: no second poll, no wait
    assert supply.polls == 1 and supply.waits == []
    polls.step_started()  # the next step polls again
    assert supply.polls == 2


def test_a_step_with_fetches_in_flight_polls_again_and_waits_for_acks_at_its_end() -> None:
    supply = CountingSupply()
    polls = StepPolls(supply, ack_wait_s=0.002)
    polls.step_started()
    supply.pending = True  # a request of this step asked a peer
    polls.step_ended()
    assert supply.polls == 2 and supply.waits == [0.002]
    polls.step_started()
    assert supply.polls == 3
