"""Counters the services keep; the vLLM facade turns them into connector stats."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class TierStats:
    """Monotonic counters of the scheduler side (since start)."""

    hits: int = 0
    misses: int = 0
    saves_planned: int = 0
    saves_done: int = 0
    saves_failed: int = 0
    loads_planned: int = 0
    loads_done: int = 0
    loads_failed: int = 0
    bytes_saved: int = 0
    bytes_loaded: int = 0
    evictions: int = 0
    not_offloaded: int = 0
    save_leases_lapsed: int = 0
    quarantines_settled: int = 0
    late_completions: int = 0
    unknown_completions: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Occupancy:
    """What the region holds right now."""

    entries: int
    used_blocks: int
    free_blocks: int
    used_bytes: int
    capacity_bytes: int
