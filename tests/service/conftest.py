"""A small engine stand-in that drives the tier services the way vLLM's hooks do, over fakes."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import pytest

from ec_connector.adapters.memory import (
    HostPayload,
    ManualClock,
    MemoryCopier,
    MemoryRegion,
    RecordingEventSink,
)
from ec_connector.application import TierScheduler, TierWorker
from ec_connector.domain.config import ConnectorConfig, Role
from ec_connector.domain.layout import Layout
from ec_connector.domain.scope import identifier_of

HIDDEN = 4
DTYPE = "bfloat16"


def encoder_output(key: str, rows: int) -> HostPayload:
    """Deterministic stand-in for an encoder output of item `key`."""
    width = HIDDEN * 2
    raw = b"".join(hashlib.sha256(f"{key}/{i}".encode()).digest()[:width] for i in range(rows))
    return HostPayload(DTYPE, rows, HIDDEN, raw)


@dataclass
class StepResult:
    loaded: dict[str, HostPayload] = field(default_factory=dict)
    encoded: list[str] = field(default_factory=list)


class Engine:
    """One scheduler side and `ranks` worker sides sharing one in-memory region."""

    def __init__(
        self,
        *,
        role: Role = Role.BOTH,
        num_blocks: int = 64,
        ranks: int = 1,
        hold: bool = False,
        clock: ManualClock | None = None,
        **config: object,
    ) -> None:
        self.layout = Layout(hidden_dim=HIDDEN, dtype=DTYPE, num_blocks=num_blocks)
        self.config = ConnectorConfig(
            role=role,
            cpu_bytes=self.layout.data_bytes,
            **config,  # type: ignore[arg-type]
        )
        self.region = MemoryRegion(self.layout, ranks=ranks)
        self.clock = clock or ManualClock()
        self.events = RecordingEventSink()
        self.scheduler = TierScheduler(
            config=self.config,
            region=self.region,
            clock=self.clock,
            events=self.events,
            ranks=ranks,
            engine_id="engine-a",
        )
        self.copiers = [MemoryCopier(self.region, hold=hold) for _ in range(ranks)]
        self.workers = [
            TierWorker(role=role, rank=r, writer=(r == 0), region=self.region, copier=c)
            for r, c in enumerate(self.copiers)
        ]

    def step(self, items: list[tuple[str, int]], *, payloads: dict[str, object] | None = None) -> StepResult:
        """Schedule `items` (entry key, rows) as one step: lookups, allocation, worker copies. The
        workers' encoder cache is keyed by vLLM's identifier of each key, as vLLM's is."""
        result = StepResult()
        hits = {key for key, _ in items if self.scheduler.has_item(key)}
        for key, rows in items:
            self.scheduler.on_allocated(key, rows)
        plan = self.scheduler.take_plan()
        for worker in self.workers:
            cache: dict[str, object] = {}
            worker.bind(plan)
            worker.start_loads(cache)
            for key, rows in items:
                identifier = identifier_of(key)
                if key in hits:
                    if worker.rank == 0:
                        result.loaded[key] = cache[identifier]  # type: ignore[assignment]
                    continue
                cache[identifier] = (payloads or {}).get(key, encoder_output(key, rows))
                if worker.rank == 0 and key not in result.encoded:
                    result.encoded.append(key)
                worker.save(cache, identifier)
            worker.clear()
        return result

    def settle(self) -> None:
        """Let every copy end, report it, and let the scheduler apply the reports."""
        for copier, worker in zip(self.copiers, self.workers, strict=True):
            copier.release_held()
            worker.flush()
        self.scheduler.poll()


@pytest.fixture
def engine_factory():
    return Engine
