"""A step that reports more copies than a rank's completion ring holds: the worker waits, never raises.

Real parts: a /dev/shm `ShmRegion` with a 4-slot ring, the CPU `TorchCopier`, `TierWorker` and its
watcher thread. The scheduler side is played by draining the region directly.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ec_connector.adapters.shm import ShmRegion
from ec_connector.adapters.torch_copy import TorchCopier
from ec_connector.application import TierWorker
from ec_connector.domain.blocks import Extent
from ec_connector.domain.config import Role
from ec_connector.domain.layout import Layout
from ec_connector.domain.transfers import PlannedCopy, StepPlan

LAYOUT = Layout(hidden_dim=16, dtype="bfloat16", num_blocks=64)
SLOTS = 4
ITEMS = 10


def test_reports_beyond_the_ring_wait_and_arrive_in_order(shm_dir: Path) -> None:
    region = ShmRegion.open(instance="ringfull", dp_rank=0, layout=LAYOUT, shm_dir=shm_dir, ring_slots=SLOTS)
    worker = TierWorker(
        role=Role.BOTH,
        rank=0,
        writer=True,
        region=region,
        copier=TorchCopier(region, device="cpu"),
        watch_interval_s=0.001,
    )
    try:
        saves = tuple(PlannedCopy(i + 1, f"k{i}", (Extent(2 * i, 2),), 2) for i in range(ITEMS))
        cache = {c.key: torch.full((2, 16), float(i), dtype=torch.bfloat16) for i, c in enumerate(saves)}
        worker.bind(StepPlan(saves=saves))
        for key in cache:
            worker.save(cache, key)
        worker.clear()  # launches the batch: 10 reports for a 4-slot ring, none may be lost or raise
        assert worker.has_in_flight()  # reports still waiting for room count as work in flight

        seen: list[int] = []
        deadline = time.monotonic() + 10
        while len(seen) < ITEMS:
            drained = region.drain_completions()  # what the scheduler side does once per step
            assert len(drained) <= SLOTS
            assert all(c.ok and c.rank == 0 for c in drained)
            seen += [c.ticket for c in drained]
            assert time.monotonic() < deadline, f"reports stopped arriving after {seen}"
            time.sleep(0.005)
        assert seen == [c.ticket for c in saves]

        deadline = time.monotonic() + 5
        while worker.has_in_flight():
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert region.drain_completions() == []
    finally:
        worker.close()
        region.close()


def test_failed_and_finished_reports_keep_their_order_and_outcome_through_a_full_ring(shm_dir: Path) -> None:
    region = ShmRegion.open(instance="ringmixed", dp_rank=0, layout=LAYOUT, shm_dir=shm_dir, ring_slots=SLOTS)
    worker = TierWorker(
        role=Role.BOTH,
        rank=0,
        writer=True,
        region=region,
        copier=TorchCopier(region, device="cpu"),
        watch_interval_s=0.001,
    )
    try:
        saves = tuple(PlannedCopy(i + 1, f"k{i}", (Extent(2 * i, 2),), 2) for i in range(ITEMS))
        # every third payload has the wrong width: its save fails, the others are copied
        cache = {
            c.key: torch.zeros((2, 8 if i % 3 == 0 else 16), dtype=torch.bfloat16)
            for i, c in enumerate(saves)
        }
        worker.bind(StepPlan(saves=saves))
        for key in cache:
            worker.save(cache, key)
        worker.clear()

        seen: list[tuple[int, bool]] = []
        deadline = time.monotonic() + 10
        while len(seen) < ITEMS:
            drained = region.drain_completions()
            assert len(drained) <= SLOTS
            seen += [(c.ticket, c.ok) for c in drained]
            assert time.monotonic() < deadline, f"reports stopped arriving after {seen}"
            time.sleep(0.005)
        failed = [c.ticket for i, c in enumerate(saves) if i % 3 == 0]
        finished = [c.ticket for i, c in enumerate(saves) if i % 3 != 0]
        assert [t for t, ok in seen if not ok] == failed  # reported as the batch was refused, in order
        assert [t for t, ok in seen if ok] == finished
        assert sorted(t for t, _ in seen) == [c.ticket for c in saves]
    finally:
        worker.close()
        region.close()
