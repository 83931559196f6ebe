"""A step that reports more copies than a rank's completion ring holds: the worker waits, never raises.

Real parts: a /dev/shm `ShmRegion` with a 4-slot ring, the CPU `TorchCopier`, `TierWorker` and its
watcher thread. The scheduler side is played by draining the region directly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from ec_connector.adapters.shm import ShmRegion
from ec_connector.adapters.torch_copy import TorchCopier
from ec_connector.application import TierWorker
from ec_connector.domain.blocks import Extent
from ec_connector.domain.config import Role
from ec_connector.domain.layout import Layout
from ec_connector.domain.transfers import Completion, PlannedCopy, StepPlan

LAYOUT = Layout(hidden_dim=16, dtype="bfloat16", num_blocks=64)
SLOTS = 4
ITEMS = 10
SAVES = tuple(PlannedCopy(i + 1, f"k{i}", (Extent(2 * i, 2),), 2) for i in range(ITEMS))


@contextmanager
def ring_worker(shm_dir: Path, instance: str) -> Iterator[tuple[ShmRegion, TierWorker]]:
    region = ShmRegion.open(instance=instance, dp_rank=0, layout=LAYOUT, shm_dir=shm_dir, ring_slots=SLOTS)
    worker = TierWorker(
        role=Role.BOTH,
        rank=0,
        writer=True,
        region=region,
        copier=TorchCopier(region, device="cpu"),
        watch_interval_s=0.001,
    )
    try:
        yield region, worker
    finally:
        worker.close()
        region.close()


def save_all(worker: TierWorker, cache: dict[str, torch.Tensor]) -> None:
    """One step: the plan, a save per item, the step's end (which launches the batch)."""
    worker.bind(StepPlan(saves=SAVES))
    for key in cache:
        worker.save(cache, key)
    worker.clear()


def drain_all(region: ShmRegion) -> list[Completion]:
    """Drain once per 5 ms, as the scheduler side does once per step, until every item is reported."""
    seen: list[Completion] = []
    deadline = time.monotonic() + 10
    while len(seen) < ITEMS:
        drained = region.drain_completions()
        assert len(drained) <= SLOTS
        seen += drained
        assert time.monotonic() < deadline, f"reports stopped arriving after {seen}"
        time.sleep(0.005)
    return seen


def test_reports_beyond_the_ring_wait_and_arrive_in_order(shm_dir: Path) -> None:
    with ring_worker(shm_dir, "ringfull") as (region, worker):
        save_all(
            worker, {c.key: torch.full((2, 16), float(i), dtype=torch.bfloat16) for i, c in enumerate(SAVES)}
        )
        assert worker.has_in_flight()  # 10 reports for a 4-slot ring: those waiting count as in flight
        seen = drain_all(region)
        assert all(c.ok and c.rank == 0 for c in seen)
        assert [c.ticket for c in seen] == [c.ticket for c in SAVES]
        deadline = time.monotonic() + 5
        while worker.has_in_flight():
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert region.drain_completions() == []


def test_failed_and_finished_reports_keep_their_order_and_outcome_through_a_full_ring(shm_dir: Path) -> None:
    with ring_worker(shm_dir, "ringmixed") as (region, worker):
        # every third payload has the wrong width: its save fails, the others are copied
        save_all(
            worker,
            {
                c.key: torch.zeros((2, 8 if i % 3 == 0 else 16), dtype=torch.bfloat16)
                for i, c in enumerate(SAVES)
            },
        )
        seen = drain_all(region)
        failed = [c.ticket for i, c in enumerate(SAVES) if i % 3 == 0]
        finished = [c.ticket for i, c in enumerate(SAVES) if i % 3 != 0]
        assert [c.ticket for c in seen if not c.ok] == failed  # reported as the batch was refused, in order
        assert [c.ticket for c in seen if c.ok] == finished
        assert sorted(c.ticket for c in seen) == [c.ticket for c in SAVES]
