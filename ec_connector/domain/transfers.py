"""Values that describe copies between device memory and the region, and cache events.

A ticket names one entry's copy (a save or a load). The scheduler side hands tickets out; workers
report them back through the region's completion table, one report per rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from ec_connector.domain.blocks import Extent, pack_extents

TICKET_LIMIT = 1 << 62


@dataclass(frozen=True, slots=True)
class PlannedCopy:
    """A copy the scheduler side asks the workers to make for entry `key`."""

    ticket: int
    key: str
    extents: tuple[Extent, ...]
    rows: int
    packed: bytes = b""  # the extents as pack_extents gives them; made here when not passed

    def __post_init__(self) -> None:
        if not 0 < self.ticket < TICKET_LIMIT:
            raise ValueError(f"ticket {self.ticket} is outside 1..2**62-1")
        if not self.extents:
            raise ValueError(f"copy of {self.key!r} has no extents; an entry holds at least one block")
        if not self.packed:
            object.__setattr__(self, "packed", pack_extents(self.extents))
        elif len(self.packed) != 16 * len(self.extents):
            raise ValueError(
                f"copy of {self.key!r}: packed extents hold {len(self.packed) // 16} runs but "
                f"extents has {len(self.extents)}; pass pack_extents(extents) or nothing"
            )


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What the workers do this step: saves (device → region) and loads (region → device)."""

    saves: tuple[PlannedCopy, ...] = ()
    loads: tuple[PlannedCopy, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.saves or self.loads)


@dataclass(slots=True)  # not frozen: one is made per item per step, and frozen init costs 2.5x
class SaveJob:
    """One entry to copy from `payload` (an opaque device buffer) into the region."""

    copy: PlannedCopy
    payload: object


def check_completions(rank: int, tickets: Sequence[int], *, ranks: int, region: str) -> None:
    """ValueError naming the first bad value of a report: a rank outside 0..ranks-1, or a ticket that
    is not an int in 1..2**62-1 (what every region's completion table can hold)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < ranks:
        raise ValueError(
            f"completion rank {rank!r} is outside 0..{ranks - 1} (region {region} has {ranks} ranks)"
        )
    for ticket in tickets:
        if type(ticket) is not int or not 0 < ticket < TICKET_LIMIT:
            raise ValueError(f"completion ticket {ticket!r} is outside 1..2**62-1")


class Completion(NamedTuple):
    """Rank `rank` finished (ok) or gave up on (not ok) the copy under `ticket`.

    A named tuple, not a frozen dataclass: the scheduler side reads one per copy per rank each step,
    and a named tuple is made in about half the time (225 against 428 ns on the CPU VM).
    """

    rank: int
    ticket: int
    ok: bool = True


class EventKind(str, Enum):
    STORED = "stored"
    EVICTED = "evicted"
    ANNOUNCED = "announced"
    EXPIRED = "expired"


class CacheEvent(NamedTuple):
    """Something an orchestrator may act on: an encoding became available or went away.

    A named tuple, as `Completion`: the scheduler side makes one per finished save (and per
    eviction), and a frozen dataclass took ~600 ns to make on the CPU VM.
    """

    kind: EventKind
    mm_hash: str
    engine_id: str
    size_bytes: int
