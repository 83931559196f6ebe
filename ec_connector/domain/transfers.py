"""Values that describe copies between device memory and the region, and cache events.

A ticket names one entry's copy (a save or a load). The scheduler side hands tickets out; workers
report them back through the region's completion table, one report per rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ec_connector.domain.blocks import Extent

TICKET_LIMIT = 1 << 62


@dataclass(frozen=True, slots=True)
class PlannedCopy:
    """A copy the scheduler side asks the workers to make for entry `key`."""

    ticket: int
    key: str
    extents: tuple[Extent, ...]
    rows: int

    def __post_init__(self) -> None:
        if not 0 < self.ticket < TICKET_LIMIT:
            raise ValueError(f"ticket {self.ticket} is outside 1..2**62-1")


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What the workers do this step: saves (device → region) and loads (region → device)."""

    saves: tuple[PlannedCopy, ...] = ()
    loads: tuple[PlannedCopy, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.saves or self.loads)


@dataclass(frozen=True, slots=True)
class SaveJob:
    """One entry to copy from `payload` (an opaque device buffer) into the region."""

    copy: PlannedCopy
    payload: object


@dataclass(frozen=True, slots=True)
class Completion:
    """Rank `rank` finished (ok) or gave up on (not ok) the copy under `ticket`."""

    rank: int
    ticket: int
    ok: bool = True


class EventKind(str, Enum):
    STORED = "stored"
    EVICTED = "evicted"
    ANNOUNCED = "announced"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class CacheEvent:
    """Something an orchestrator may act on: an encoding became available or went away."""

    kind: EventKind
    mm_hash: str
    engine_id: str
    size_bytes: int
