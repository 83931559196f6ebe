"""Counters the services keep; the vLLM facade turns them into connector stats."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

SAMPLE_LIMIT = 4096
"""Most durations one `Samples` keeps per name between two takes (the rest are counted, not kept)."""


class Samples:
    """Durations (seconds) observed since they were last taken, by name; bounded per name."""

    __slots__ = ("_samples", "dropped")

    def __init__(self) -> None:
        self._samples: dict[str, list[float]] = {}
        self.dropped = 0

    def observe(self, name: str, seconds: float) -> None:
        kept = self._samples.setdefault(name, [])
        if len(kept) < SAMPLE_LIMIT:
            kept.append(max(0.0, float(seconds)))
        else:
            self.dropped += 1

    def take(self) -> dict[str, list[float]]:
        """Every duration kept since the last take, by name; empties the store."""
        out, self._samples = self._samples, {}
        return out

    def __repr__(self) -> str:
        return f"Samples({ {k: len(v) for k, v in self._samples.items()} }, dropped={self.dropped})"


def _counters(stats: object) -> dict[str, int]:
    return {f.name: getattr(stats, f.name) for f in fields(stats) if f.name != "latencies"}  # type: ignore[arg-type]


@dataclass(slots=True)
class TierStats:
    """Monotonic counters of the scheduler side (since start)."""

    hits: int = 0
    misses: int = 0
    misses_saving: int = 0
    """Of `misses`, items the tier held but was still saving: a repeat that came before its first
    request's save landed (it is encoded again)."""
    saves_planned: int = 0
    saves_done: int = 0
    saves_failed: int = 0
    loads_planned: int = 0
    loads_done: int = 0
    loads_failed: int = 0
    bytes_saved: int = 0
    bytes_loaded: int = 0
    evictions: int = 0
    evictions_for_runs: int = 0
    """Of `evictions`, those made beyond the space needed, to keep a new entry's runs long."""
    not_offloaded: int = 0
    save_leases_lapsed: int = 0
    quarantines_settled: int = 0
    late_completions: int = 0
    unknown_completions: int = 0
    grants_lapsed: int = 0
    latencies: Samples = field(default_factory=Samples, repr=False, compare=False)
    """"save" and "load": seconds from planning a copy to its completion on every rank."""

    def as_dict(self) -> dict[str, int]:
        """The counters (not the latencies)."""
        return _counters(self)


@dataclass(frozen=True, slots=True)
class Occupancy:
    """What the region holds right now."""

    entries: int
    used_blocks: int
    free_blocks: int
    used_bytes: int
    capacity_bytes: int


@dataclass(frozen=True, slots=True)
class TierSnapshot:
    """The scheduler side's counters, the latencies taken since the last snapshot, and the occupancy,
    read at one instant."""

    counters: dict[str, int]
    samples: dict[str, list[float]]
    occupancy: Occupancy


@dataclass(slots=True)
class PeerStats:
    """Monotonic counters of the P2P flows (producer and consumer sides)."""

    # consumer
    requests_sent: int = 0
    acks_ok: int = 0
    nack_missing: int = 0
    nack_not_ready: int = 0
    nack_incompat: int = 0
    nack_version: int = 0
    nack_internal: int = 0
    ack_timeouts: int = 0
    peers_lost: int = 0
    agents_replaced: int = 0
    reads_done: int = 0
    reads_failed: int = 0
    read_timeouts: int = 0
    bytes_read: int = 0
    fallbacks: int = 0
    unavailable_requests: int = 0
    bad_params: int = 0
    bad_acks: int = 0
    late_acks: int = 0
    # producer
    grants: int = 0
    grants_released: int = 0
    announced: int = 0
    unservable: int = 0
    quarantines: int = 0
    latencies: Samples = field(default_factory=Samples, repr=False, compare=False)
    """"peer_read": seconds of one NIXL READ (posted to done); "peer_fetch": XferReq sent to entry ready."""

    def count_nack(self, status: str) -> None:
        attr = status.lower()
        setattr(self, attr, getattr(self, attr) + 1)

    def as_dict(self) -> dict[str, int]:
        """The counters (not the latencies)."""
        return _counters(self)
