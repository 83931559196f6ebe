"""`StepPolls`: when the scheduler side polls and waits on its supply within an engine step (the
real-parts check of what the waits buy is tests/fault/test_step_polls.py)."""

from __future__ import annotations

from collections.abc import Sequence

from ec_connector.application.consumer import WantedItem
from ec_connector.application.roles import StepPolls


class CountingSupply:
    """A supply that counts its polls and records its ack waits; `pending`: fetches in flight."""

    def __init__(self, landing_s: float = 0.0, lands: bool = False) -> None:
        self.polls = 0
        self.waits: list[float] = []
        self.landing_waits: list[float] = []
        self.pending = False
        self.landing_s = landing_s  # what each landing wait spends (capped by its budget)
        self.lands = lands  # whether the pulls in flight land within a landing wait

    def poll(self) -> None:
        self.polls += 1

    def ensure_available(self, request_id: str, params: object, items: Sequence[WantedItem]) -> bool:
        return not self.pending

    def recheck(self, request_id: str, items: Sequence[WantedItem]) -> bool:
        return not self.pending

    def take_unavailable(self) -> set[str]:
        return set()

    def has_pending_work(self) -> bool:
        return self.pending

    def await_acks(self, budget_s: float) -> None:
        self.waits.append(budget_s)

    def await_landed(self, budget_s: float) -> float:
        self.landing_waits.append(budget_s)
        if self.lands:
            self.pending = False
        return min(self.landing_s, budget_s)


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


def test_a_request_whose_pulls_land_within_the_wait_is_available_in_its_step() -> None:
    supply = CountingSupply(landing_s=0.001, lands=True)
    polls = StepPolls(supply, pull_wait_s=0.005)
    supply.pending = True  # the request's items are asked for when it is checked
    assert polls.ensure_available("req-1", None, [])
    assert supply.landing_waits == [0.005] and supply.polls == 1


def test_a_request_available_at_once_costs_no_wait() -> None:
    supply = CountingSupply()
    polls = StepPolls(supply, pull_wait_s=0.005)
    assert polls.ensure_available("req-1", None, [])
    assert supply.landing_waits == []


def test_the_pull_wait_is_one_budget_for_the_whole_step() -> None:
    supply = CountingSupply(landing_s=0.003)  # pulls that never land: each wait spends 3 ms
    supply.pending = True
    polls = StepPolls(supply, pull_wait_s=0.005)
    for request in ("req-1", "req-2", "req-3"):
        assert not polls.ensure_available(request, None, [])
    assert supply.landing_waits == [0.005, 0.002]  # the third request found the budget spent
    polls.step_ended()
    assert not polls.ensure_available("req-1", None, [])  # the next step has its own budget
    assert supply.landing_waits == [0.005, 0.002, 0.005]


def test_no_pull_wait_leaves_the_request_for_a_later_step() -> None:
    supply = CountingSupply(lands=True)
    supply.pending = True
    polls = StepPolls(supply, pull_wait_s=0.0)
    assert not polls.ensure_available("req-1", None, [])
    assert supply.landing_waits == []
