"""The worker side end to end over a real /dev/shm region, with one scheduler and two worker processes.

The test process plays the engine core: a `TierScheduler` over its own `ShmRegion` handle (slot 0).
Two worker processes (multiprocessing "spawn") open the same region (slots 1 and 2) and each runs
a `TierWorker` over a `TorchCopier` on the leg's device; rank 0 writes, both load.

    step 1: every item misses; the scheduler plans its save; worker 0 copies the encoder outputs
            into the region, worker 1's save is a no-op; the scheduler sees the entries turn ready
            through the region's completion table alone.
    step 2: every item hits (listed in the reverse order); both workers load into fresh tensors
            and compare them bytewise with the originals, regenerated from the seed; the scheduler
            sees every load completed by both ranks (entries unpinned, nothing pending).

The encoder outputs are views of two batched outputs (as vLLM splits an encoder batch per item),
filled with seeded random bits (NaN and denormal patterns included), so a byte flipped anywhere
shows. On CUDA, 2 KiB rows put the small items' runs through the copy kernel and the large ones
through the copy engines. The CPU leg runs anywhere; the CUDA leg needs a GPU (the region is
pinned with cudaHostRegister, which a file outside tmpfs would fail).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from ec_connector.adapters.memory import ManualClock, RecordingEventSink
from ec_connector.adapters.shm import ShmRegion
from ec_connector.application import TierScheduler, TierWorker
from ec_connector.domain.config import ConnectorConfig, Role
from ec_connector.domain.layout import Layout
from ec_connector.domain.transfers import EventKind, StepPlan

ROWS = (12, 64, 333, 1024, 4097)  # one item each, from a handful of rows to a large image
FIRST_BATCH = 3  # items encoded in the first of two encoder batches
SPARE_BLOCKS = 470  # the region holds every item with room to spare
WORKERS = 2
PARTICIPANTS = WORKERS + 1  # the scheduler's handle takes slot 0
SEED = 20261129
NO_PLAN = StepPlan()

_NO_CUDA = "needs a CUDA device (torch.cuda.is_available() is False); run it on the GPU machine"
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "cuda",
        id="cuda",
        marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason=_NO_CUDA)],
    ),
    # the writer rank's saves queued on the driver by the save launcher's thread (the container's default)
    pytest.param(
        "cuda+launcher",
        id="cuda-launcher",
        marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason=_NO_CUDA)],
    ),
]


def _items() -> list[tuple[str, int]]:
    return [(f"mm-{rows}rows", rows) for rows in ROWS]


def encoder_outputs(seed: int, rows: list[int], width: int, device: str) -> list[torch.Tensor]:
    """The items' outputs, seeded random bits: views of two batched bf16 encoder outputs on `device`.

    Items 0..FIRST_BATCH-1 come from one encoder batch, the rest from another (as vLLM splits a
    batch's output per item). Generated on the CPU from `seed`: the same bits in every process.
    """
    gen = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(1 << 15), 1 << 15, (sum(rows), width), dtype=torch.int16, generator=gen)
    cut = sum(rows[:FIRST_BATCH])
    outputs: list[torch.Tensor] = []
    for part, sizes in ((bits[:cut], rows[:FIRST_BATCH]), (bits[cut:], rows[FIRST_BATCH:])):
        outputs += part.view(torch.bfloat16).to(device).split(sizes)
    return outputs


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bytewise equality (torch.equal on bf16 would call a NaN unequal to itself)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16))


# -- the worker processes ----------------------------------------------------------------------


def _settle(worker: TierWorker, timeout_s: float) -> None:
    """Flush until every copy of this worker has ended and been reported."""
    deadline = time.monotonic() + timeout_s
    worker.flush()
    while worker.has_in_flight():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {worker.rank}: copies still in flight after {timeout_s} s")
        time.sleep(0.001)
        worker.flush()


def _worker_main(rank: int, setup: dict[str, Any], commands: Any, results: Any) -> None:
    """One worker process: open the region in slot rank + 1, then run the steps it is sent."""
    try:
        from ec_connector.adapters.torch_copy import TorchCopier

        device, _, launcher = setup["device"].partition("+")
        if device == "cuda":
            torch.cuda.set_device(0)
        layout = Layout(**setup["layout"])
        items: list[tuple[str, int]] = setup["items"]
        rows = [r for _, r in items]
        region = ShmRegion.open(
            instance=setup["instance"],
            dp_rank=0,
            layout=layout,
            participants=PARTICIPANTS,
            slot=rank + 1,
            ranks=WORKERS,
            shm_dir=setup["shm_dir"],
        )
        copier = TorchCopier(region, device=device, save_launcher=launcher == "launcher")
        worker = TierWorker(role=Role.BOTH, rank=rank, writer=(rank == 0), region=region, copier=copier)
        results.put(("ready", rank, {"device": str(copier.device)}))
        while True:
            op, plan = commands.get(timeout=setup["timeout_s"])
            assert isinstance(plan, StepPlan)
            if op == "save":
                # every rank computes the same encoder outputs; only the writer rank saves them
                outputs = encoder_outputs(setup["seed"], rows, layout.hidden_dim, device)
                cache: dict[str, object] = {}
                worker.bind(plan)
                worker.start_loads(cache)
                for (key, _), out in zip(items, outputs, strict=True):
                    cache[key] = out
                    worker.save(cache, key)
                worker.clear()
                _settle(worker, setup["timeout_s"])
                results.put(("saved", rank, {}))
            elif op == "load":
                cache = {}
                worker.bind(plan)
                worker.start_loads(cache)
                expected = encoder_outputs(setup["seed"], rows, layout.hidden_dim, device)
                report = {}
                for (key, _), want in zip(items, expected, strict=True):
                    got = cache.get(key)
                    report[key] = {
                        "loaded": isinstance(got, torch.Tensor),
                        "device": str(got.device) if isinstance(got, torch.Tensor) else None,
                        "equal": isinstance(got, torch.Tensor) and _same_bits(got, want),
                    }
                worker.clear()
                _settle(worker, setup["timeout_s"])
                results.put(("loaded", rank, report))
            elif op == "close":
                worker.close()
                region.close()
                results.put(("closed", rank, {}))
                return
            else:
                raise ValueError(f"unknown command {op!r}")
    except BaseException:
        results.put(("error", rank, traceback.format_exc()))
        raise


# -- the scheduler side (this process) ---------------------------------------------------------


class Workers:
    """The worker processes and their queues; every wait is bounded and surfaces a worker's error."""

    def __init__(self, setup: dict[str, Any]) -> None:
        ctx = mp.get_context("spawn")
        self.timeout_s: float = setup["timeout_s"]
        self.results = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(WORKERS)]
        self._early: list[tuple[str, int, Any]] = []  # replies seen by check() before expect()
        self.procs = [
            ctx.Process(
                target=_worker_main,
                args=(r, setup, self.commands[r], self.results),
                name=f"ec-worker-{r}",
                daemon=True,
            )
            for r in range(WORKERS)
        ]
        for proc in self.procs:
            proc.start()

    def send(self, op: str, plan: StepPlan = NO_PLAN) -> None:
        for q in self.commands:
            q.put((op, plan))

    def check(self) -> None:
        """Fail at once if a worker reported an error (non-blocking); keep other replies."""
        while True:
            try:
                reply = self.results.get_nowait()
            except queue.Empty:
                return
            kind, rank, body = reply
            assert kind != "error", f"worker {rank} failed:\n{body}"
            self._early.append(reply)

    def expect(self, kind: str) -> dict[int, Any]:
        """The `kind` reply of every worker."""
        got: dict[int, Any] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(got) < WORKERS:
            if self._early:
                k, rank, body = self._early.pop(0)
            else:
                try:
                    k, rank, body = self.results.get(timeout=0.2)
                except queue.Empty:
                    dead = [f"{p.name} (exit {p.exitcode})" for p in self.procs if not p.is_alive()]
                    assert not dead, f"{dead} ended before sending {kind!r}"
                    assert time.monotonic() < deadline, f"no {kind!r} from every worker in {self.timeout_s} s"
                    continue
            assert k == kind, f"worker {rank} sent {k!r} while {kind!r} was expected:\n{body}"
            assert rank not in got, f"worker {rank} sent {kind!r} twice"
            got[rank] = body
        return got

    def join(self) -> list[int | None]:
        for proc in self.procs:
            proc.join(timeout=self.timeout_s)
        return [p.exitcode for p in self.procs]

    def kill(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)


def _wait_until(condition: Any, scheduler: TierScheduler, workers: Workers, what: str) -> float:
    """Poll the scheduler until `condition()`; returns the seconds it took."""
    t0 = time.monotonic()
    while True:
        scheduler.poll()
        if condition():
            return time.monotonic() - t0
        workers.check()
        assert time.monotonic() - t0 < workers.timeout_s, f"the scheduler never saw {what}"
        time.sleep(0.002)


def _stored_differs(region: ShmRegion, scheduler: TierScheduler, items: list[tuple[str, int]]) -> list[str]:
    """Keys whose entry's bytes, read through this process's mapping, differ from the original."""
    layout = region.layout
    originals = encoder_outputs(SEED, [r for _, r in items], layout.hidden_dim, "cpu")
    data = region.data()
    host = torch.frombuffer(data, dtype=torch.int16).view(layout.num_blocks, layout.hidden_dim)
    try:
        differ = []
        for (key, _), want in zip(items, originals, strict=True):
            entry = scheduler.entry(key)
            assert entry is not None, f"{key} has no entry"
            stored = torch.cat([host[e.start : e.end] for e in entry.extents])
            if not torch.equal(stored, want.view(torch.int16)):
                differ.append(key)
        return differ
    finally:
        del host
        data.release()


@pytest.mark.parametrize("width", [1024, 3584], ids=lambda w: f"bf16x{w}")
@pytest.mark.parametrize("device", DEVICES)
def test_two_workers_save_and_load_through_a_shared_region(device: str, width: int, shm_dir: Path) -> None:
    items = _items()
    rows = [r for _, r in items]
    layout = Layout(hidden_dim=width, dtype="bfloat16", num_blocks=sum(rows) + SPARE_BLOCKS)
    instance = f"t{uuid.uuid4().hex[:10]}"
    setup = {
        "device": device,
        "layout": {"hidden_dim": layout.hidden_dim, "dtype": layout.dtype, "num_blocks": layout.num_blocks},
        "items": items,
        "instance": instance,
        "shm_dir": str(shm_dir),
        "seed": SEED,
        "timeout_s": 240.0 if device.startswith("cuda") else 60.0,  # CUDA: context and kernel compiles
    }
    region = ShmRegion.open(
        instance=instance,
        dp_rank=0,
        layout=layout,
        participants=PARTICIPANTS,
        slot=0,
        ranks=WORKERS,
        shm_dir=shm_dir,
    )
    path = region.path
    assert path.parent == shm_dir and path.exists()
    events = RecordingEventSink()
    scheduler = TierScheduler(
        config=ConnectorConfig(role=Role.BOTH, cpu_bytes=layout.data_bytes),
        region=region,
        clock=ManualClock(),
        events=events,
        ranks=WORKERS,
        engine_id=instance,
    )
    workers = Workers(setup)
    try:
        ready = workers.expect("ready")
        assert sorted(ready) == [0, 1]
        assert all(body["device"].startswith(device.partition("+")[0]) for body in ready.values()), ready
        assert not path.exists(), "the last participant to join removes the region's name"

        # -- step 1: every item misses; plan the saves; rank 0 writes ------------------------------
        assert not any(scheduler.has_item(key) for key, _ in items)
        for key, n in items:
            scheduler.on_allocated(key, n)
        plan = scheduler.take_plan()
        assert [c.key for c in plan.saves] == [k for k, _ in items] and not plan.loads
        workers.send("save", plan)
        _wait_until(
            lambda: all(scheduler.is_ready(k) for k, _ in items), scheduler, workers, "every save ready"
        )
        workers.expect("saved")
        assert scheduler.stats.saves_done == len(items) and scheduler.stats.saves_failed == 0
        assert [(e.kind, e.mm_hash) for e in events.events] == [(EventKind.STORED, k) for k, _ in items]

        # the scheduler's own mapping holds the bytes rank 0 wrote
        assert _stored_differs(region, scheduler, items) == []

        # -- step 2: every item hits (listed the other way round); both ranks load and compare -----
        again = items[::-1]  # a later request may list them in any order: runs out of region order
        assert all(scheduler.has_item(key) for key, _ in again)
        for key, n in again:
            scheduler.on_allocated(key, n)
        plan = scheduler.take_plan()
        assert [c.key for c in plan.loads] == [k for k, _ in again] and not plan.saves
        assert all(scheduler.entry(k).pin_count == 1 for k, _ in items)  # type: ignore[union-attr]
        workers.send("load", plan)
        _wait_until(lambda: not scheduler.has_pending_work(), scheduler, workers, "every load done")
        reports = workers.expect("loaded")
        for rank, report in sorted(reports.items()):
            for key, _ in items:
                seen = report[key]
                assert seen["loaded"], f"rank {rank} has no tensor for {key}"
                assert seen["device"].startswith(device.partition("+")[0]), (
                    f"rank {rank} loaded {key} onto {seen['device']}"
                )
                assert seen["equal"], f"rank {rank}: {key} differs from the original after the round trip"
        assert all(not scheduler.entry(k).is_pinned for k, _ in items)  # type: ignore[union-attr]
        stats = scheduler.stats
        assert (stats.loads_done, stats.loads_failed, stats.unknown_completions) == (len(items), 0, 0)
        assert not scheduler.has_pending_work()

        # -- shutdown ------------------------------------------------------------------------------
        workers.send("close")
        workers.expect("closed")
        assert workers.join() == [0, 0]
    finally:
        workers.kill()
        region.close()
    assert not path.exists()
    assert list(shm_dir.iterdir()) == []
