"""What the scheduler side offers vLLM's scheduler-side hooks: one object per part, none optional.

A role that pulls from peers gets a ConsumerFetcher as its `supply` (a FleetFetcher in front of it
when the replica has fleet peers), others a LocalSupply; a role that serves peers gets a
ProducerDesk as its `publisher`, others a NoPublisher. Every request's items are keyed through
`scopes` (tenant scopes); `fleet` hears of vLLM's allocations (a FleetFetcher, or NoFleet). The
container picks them (container.py); the entry point calls them the same way in every mode.
StatsService reads the counters of every part into one report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ec_connector.application.consumer import WantedItem
from ec_connector.application.fleet import FleetStats
from ec_connector.application.scheduler import TierScheduler
from ec_connector.application.scoping import RequestScopes
from ec_connector.application.stats import PeerStats
from ec_connector.ports.runtime import EventSink


class Supply(Protocol):
    """Makes a request's items available before it is scheduled (ConsumerFetcher's contract)."""

    def poll(self) -> None: ...

    def ensure_available(self, request_id: str, params: object, items: Sequence[WantedItem]) -> bool: ...

    def recheck(self, request_id: str, items: Sequence[WantedItem]) -> bool: ...

    def take_unavailable(self) -> set[str]: ...

    def has_pending_work(self) -> bool: ...

    def await_acks(self, budget_s: float) -> None: ...

    def await_landed(self, budget_s: float) -> float: ...


class StepPolls:
    """When the scheduler side polls and waits on its supply during an engine step.

    At the step's start (its first `ensure_cache_available`): once, so every request of the step
    sees the same settled fetches. When a request's items are being pulled: up to what is left of
    `pull_wait_s` (`step_pull_wait_s`, for the whole step) for them to land, so the request is
    scheduled in this step. At its end (`build_connector_meta`): again while fetches are in
    flight, waiting up to `ack_wait_s` (`step_ack_wait_s`) for the acks of the asks made while
    the step was scheduled; handling an ack then posts its READ, whose bytes land during the
    model's forward, so the request is ready at the next step instead of the one after.
    """

    def __init__(self, supply: Supply, ack_wait_s: float = 0.0, pull_wait_s: float = 0.0) -> None:
        self._supply = supply
        self._ack_wait_s = ack_wait_s
        self._pull_wait_s = pull_wait_s
        self._pull_left = pull_wait_s
        self._polled = False

    def ensure_available(self, request_id: str, params: object, items: Sequence[WantedItem]) -> bool:
        """The supply's answer for the request (False: defer it), once its pulls had their wait."""
        self.step_started()
        if self._supply.ensure_available(request_id, params, items):
            return True
        if self._pull_left <= 0:
            return False
        self._pull_left -= self._supply.await_landed(self._pull_left)
        return self._supply.recheck(request_id, items)

    def step_started(self) -> None:
        if not self._polled:
            self._polled = True
            self._pull_left = self._pull_wait_s
            self._supply.poll()

    def step_ended(self) -> None:
        self._polled = False
        if self._supply.has_pending_work():
            self._supply.poll()
            self._supply.await_acks(self._ack_wait_s)


class Publisher(Protocol):
    """Offers a finished request's items to peers (ProducerDesk's contract)."""

    def publish(self, items: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]] | None: ...


class Allocations(Protocol):
    """Hears which items vLLM allocated here (FleetFetcher's `note_local`)."""

    def note_local(self, key: str, rows: int) -> None: ...


class NoFleet:
    """The allocations listener of a replica without fleet peers: nothing to note."""

    def note_local(self, key: str, rows: int) -> None:
        pass


class LocalSupply:
    """The supply of a role that does not pull from peers: every item is available at once (a miss
    is encoded by the worker), so `items` is never read."""

    def poll(self) -> None:
        pass

    def ensure_available(self, request_id: str, params: object, items: Sequence[WantedItem]) -> bool:
        return True

    def recheck(self, request_id: str, items: Sequence[WantedItem]) -> bool:
        return True

    def take_unavailable(self) -> set[str]:
        return set()

    def has_pending_work(self) -> bool:
        return False

    def await_acks(self, budget_s: float) -> None:
        pass

    def await_landed(self, budget_s: float) -> float:
        return 0.0


class NoPublisher:
    """The publisher of a role that does not serve peers: a finished request publishes no
    `ec_transfer_params`, and `items` is never read."""

    def publish(self, items: Mapping[str, Mapping[str, Any]]) -> None:
        return None


@dataclass(frozen=True, slots=True)
class SchedulerSide:
    """The services behind vLLM's scheduler-side hooks."""

    tier: TierScheduler
    supply: Supply
    publisher: Publisher
    scopes: RequestScopes
    fleet: Allocations


class StatsService:
    """One report of the scheduler side's counters for vLLM's stats path (`report`).

    Counters are reported as increments since the previous report (vLLM sums them); latencies as
    the samples observed since then; occupancy as gauges. Peer counters are included where the role
    has a P2P service (`peer` given), fleet counters (`fleet_*`) where it has fleet peers (`fleet`
    given). Peer and fleet counters have one writer each (the step thread, the desk's I/O thread
    for its grant counters, the feed's thread for the directory's) and their latencies are observed
    on the step thread, so they are read without a lock; the tier's are read under its own
    (`TierScheduler.snapshot`).
    """

    def __init__(
        self,
        tier: TierScheduler,
        events: EventSink,
        peer: PeerStats | None = None,
        fleet: FleetStats | None = None,
    ) -> None:
        self._tier = tier
        self._events = events
        self._peer = peer
        self._fleet = fleet
        self._reported: dict[str, int] = {}

    def report(self) -> dict[str, Any]:
        """Counter increments, `<name>_seconds` latency samples and occupancy gauges, by name."""
        tier = self._tier.snapshot()
        counters, samples, occupancy = tier.counters, tier.samples, tier.occupancy
        if self._peer is not None:
            counters.update({f"peer_{k}": v for k, v in self._peer.as_dict().items()})
            samples.update(self._peer.latencies.take())
        if self._fleet is not None:
            counters.update({f"fleet_{k}": v for k, v in self._fleet.as_dict().items()})
        # the event sinks that count (ZmqEventSink) expose `published` and `dropped`; LogEventSink does not
        counters["events_published"] = getattr(self._events, "published", 0)
        counters["events_dropped"] = getattr(self._events, "dropped", 0)
        delta = {k: v - self._reported.get(k, 0) for k, v in counters.items()}
        self._reported = counters
        return {
            **delta,
            **{f"{k}_seconds": v for k, v in samples.items()},
            "entries": occupancy.entries,
            "used_blocks": occupancy.used_blocks,
            "free_blocks": occupancy.free_blocks,
            "used_bytes": occupancy.used_bytes,
            "capacity_bytes": occupancy.capacity_bytes,
        }
