"""Host time of `TorchCopier.save`/`load` for batches of 32 entries: what the engine's step thread pays.

`bench/copy_bandwidth.py` reports host time too, but from a handful of repetitions among large
copies, which vary 30-100% run to run. Here every case is 20 warm-up calls and then `--iters` timed
calls of each kind (save and load in turn), each on an idle device, inside `torch.inference_mode()` and
on a stream of the caller's own, as vLLM's model runner calls the connector (on CUDA, vLLM's
`current_stream()` makes a stream per process; `--stream default` times calls from the legacy default
stream instead); it prints median, p10 and p90, and the cost of the pieces
that do not depend on our code (the driver's batched copy submission and torch's `split` into
per-entry views) measured alongside. Each case's own driver call is timed too, in turn with the
copier's calls: the very `cudaMemcpyBatchAsync` calls (same copies) the copier hands the driver for
that batch's save and load, made alone ("driver"; batches with kernel runs have none). The step
thread's call less that one is our code's part of the launch, which the host's drift over minutes
moves far less than the whole (the driver's part varies 2-3x between instances).
Every case's bytes are verified once. Each case is also timed through `TierWorker` as vLLM's step
thread drives it (bind the step's plan, `save` per item then `flush`; or `start_loads`), which adds
the per-item checks and the bookkeeping around the copier. Saves are timed twice, in turn: with the
save launcher (a native thread hands copy-engine batches to the driver; every role's default) and
with the step thread making the driver call itself (`save_launcher=False`, the baseline; "inline"
columns). The launcher's driver work still runs beside whatever the step thread does next: from the
legacy default stream, CUDA calls made at once wait for it; from a stream of the caller's own they
do not (docs/benchmarks.md, "A step with the save launcher"). `--period-ms` paces the calls as once
per engine step (the time since the previous call moves a launch's host time more than its batch
does: docs/benchmarks.md, "Host launch time"). Each cell also gives the calling thread's own CPU
time over the same window ("cpu", median): on a shared guest, time the hypervisor gives the vCPU to
other guests (`steal`, printed per case from /proc/stat) counts on the wall clock but not there, nor
does time the thread spent blocked (a lock, a sleep); so the two apart show how much of a slow call
the thread was not running at all.

    python bench/copy_host_launch.py              # needs CUDA
    python bench/copy_host_launch.py --iters 500 --json host.json
    python bench/copy_host_launch.py --passes 3   # and the lowest of three medians per case
    python bench/copy_host_launch.py --only aged --only "1 run"   # only the cases so named
    python bench/copy_host_launch.py --period-ms 12   # a call every 12 ms, as once per engine step
    python bench/copy_host_launch.py --period-ms 12 --preamble 6   # after a step's input copies
    python bench/copy_host_launch.py --dma-min-bytes none   # every run through the copy kernel
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.copy_bandwidth import add_stream_option  # noqa: E402
from bench.copy_host_launch_cases import BATCH, cases  # noqa: E402
from bench.copy_host_launch_report import print_best, print_case  # noqa: E402
from ec_connector.adapters.memory import MemoryRegion  # noqa: E402
from ec_connector.adapters.torch_copy import TorchCopier  # noqa: E402
from ec_connector.adapters.torch_copy.copier import DMA_MIN_BYTES  # noqa: E402
from ec_connector.adapters.torch_copy.cuda import FEW_RUNS, MIXED_MIN_RUNS  # noqa: E402
from ec_connector.adapters.torch_copy.native.batchplan import BatchPlan, BatchPlanner  # noqa: E402
from ec_connector.application.worker import TierWorker  # noqa: E402
from ec_connector.domain.config import Role  # noqa: E402
from ec_connector.domain.layout import Layout  # noqa: E402
from ec_connector.domain.transfers import PlannedCopy, SaveJob, StepPlan  # noqa: E402


class Timed(NamedTuple):
    """One timed call: wall-clock seconds, and the calling thread's own CPU seconds in that window
    (`CLOCK_THREAD_CPUTIME_ID`: on a guest kernel with steal-time accounting, time the hypervisor
    gave the vCPU to someone else is not counted, nor is time the thread slept)."""

    wall: float
    cpu: float


def percentiles(calls: list[Timed]) -> dict[str, float]:
    xs = sorted(c.wall for c in calls)
    return {
        "median_us": statistics.median(xs) * 1e6,
        "p10_us": xs[len(xs) // 10] * 1e6,
        "p90_us": xs[9 * len(xs) // 10] * 1e6,
        "cpu_median_us": statistics.median(c.cpu for c in calls) * 1e6,
    }


class Steal:
    """The share of the machine's CPU time the hypervisor took for other guests since this was
    made (`steal` in /proc/stat, all CPUs; 0 where the kernel does not report it)."""

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return 0, 0
        return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])

    def percent(self) -> float:
        (s0, t0), (s1, t1) = self._start, self._read()
        return 100.0 * (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0


class Pacer:
    """Starts each timed call `period` seconds after the previous one started, spinning in Python
    until then (0: at once, right after the previous call's copies ended), after `preamble` small
    host-to-device copies on the caller's stream (untimed), as vLLM's `_prepare_inputs` makes just
    before a step's loads (input ids, positions, sequence lengths: `copy_to_gpu`).

    A launch's host time depends on what the host did before it: after the ~10 ms wait for a batch
    of 32 x 16 MiB it read up to 2x what it read after the ~0.6 ms wait for 32 x 1 MiB, with the same
    copies, and 12 ms of spinning first raised even the driver's own call 1-5x (docs/benchmarks.md,
    "Host launch time"). A period longer than the largest batch's copy gives every case the same time
    since its previous call, as a step thread that loads once per engine step has.
    """

    def __init__(self, period: float, preamble: int = 0) -> None:
        self.period = period
        self._due = 0.0
        self._inputs = [
            (
                torch.zeros(1024, dtype=torch.int32, pin_memory=True),
                torch.zeros(1024, dtype=torch.int32, device="cuda"),
            )
            for _ in range(preamble)
        ]

    def start(self) -> float:
        """Wait for the next call's turn, make the preamble's copies; returns the call's start
        (`time.perf_counter()`)."""
        now = time.perf_counter()
        while now < self._due:
            now = time.perf_counter()
        for host, device in self._inputs:
            device.copy_(host, non_blocking=True)
        now = time.perf_counter()
        self._due = now + self.period
        return now


def measure(
    name: str,
    width: int,
    rows: int,
    extents: list,
    blocks: int,
    iters: int,
    dma_min_bytes: int | None,
    pacer: Pacer,
) -> dict:
    layout = Layout(hidden_dim=width, dtype="bfloat16", num_blocks=blocks)
    region = MemoryRegion(layout)
    copier = TorchCopier(region, device="cuda", dma_min_bytes=dma_min_bytes, save_launcher=True)
    inline = TorchCopier(region, device="cuda", dma_min_bytes=dma_min_bytes, save_launcher=False)
    if name.endswith("one output"):
        payloads = list(torch.randn(rows * len(extents), width, device="cuda").to(torch.bfloat16).split(rows))
    else:
        payloads = [torch.randn(rows, width, device="cuda").to(torch.bfloat16) for _ in extents]
    tickets = iter(range(1, 1 << 60))

    worker = TierWorker(role=Role.BOTH, rank=0, writer=True, region=region, copier=copier)
    inline_worker = TierWorker(role=Role.BOTH, rank=0, writer=True, region=region, copier=inline)
    cache = {f"k{i}": p for i, p in enumerate(payloads)}

    def host_time(launch: Callable[[], object], settle: Callable[[], object]) -> Timed:
        """Host seconds of `launch()` on an idle device, started at the pacer's turn, on the wall
        clock and in the thread's own CPU time; then wait for the device and `settle()`."""
        torch.cuda.synchronize()
        t0 = pacer.start()
        c0 = time.thread_time()
        launch()
        cpu = time.thread_time() - c0
        dt = time.perf_counter() - t0
        torch.cuda.synchronize()
        settle()
        return Timed(dt, cpu)

    # Settling waits for every copy to be reported: a save's copies are queued by the launcher's
    # thread, possibly after the device synchronize above (as the scheduler side waits for a save's
    # completion before anything loads the entry).
    def settle_copier() -> None:
        for each in (copier, inline):
            while each.in_flight():
                each.poll()
            each.drain_timings()

    def settle_worker() -> None:
        for each in (worker, inline_worker):
            each.flush()
            while each.has_in_flight():
                each.flush()
        region.drain_completions()

    def save(by: TorchCopier = copier) -> Timed:
        pairs = zip(extents, payloads, strict=True)
        jobs = [SaveJob(PlannedCopy(next(tickets), "k", e, rows), p) for e, p in pairs]
        return host_time(lambda: by.save(jobs), settle_copier)

    # The previous batch's outputs are dropped before the timed call, not inside it: freeing them
    # (32 views and their allocation, ~6 µs on the H200) is the encoder cache's later work, not the
    # launch's.
    loaded: list = []

    def load() -> Timed:
        copies = [PlannedCopy(next(tickets), "k", e, rows) for e in extents]
        loaded.clear()

        def launch() -> None:
            loaded[:] = copier.load(copies)

        return host_time(launch, settle_copier)

    def keyed() -> tuple[PlannedCopy, ...]:
        return tuple(PlannedCopy(next(tickets), k, e, rows) for k, e in zip(cache, extents, strict=True))

    def worker_save(by: TierWorker = worker) -> Timed:
        # what vLLM's step thread runs for a batch of offloads: the plan, save_caches per item, the flush
        plan = StepPlan(saves=keyed())

        def launch() -> None:
            by.bind(plan)
            for key in cache:
                by.save(cache, key)
            by.flush()

        return host_time(launch, settle_worker)

    encoder_cache: dict = {}

    def worker_load() -> Timed:
        plan = StepPlan(loads=keyed())
        encoder_cache.clear()

        def launch() -> None:
            worker.bind(plan)
            worker.start_loads(encoder_cache)

        return host_time(launch, settle_worker)

    from ec_connector.adapters.torch_copy.cudart import runtime

    rt = runtime()
    driver_stream = torch.cuda.Stream()
    out = torch.empty((rows * len(extents), width), dtype=torch.bfloat16, device="cuda")

    def driver_call(plan: BatchPlan, *, load: bool) -> Callable[[], Timed] | None:
        """The driver's own calls for a planned batch: `memcpy_batch` of its columns, as the CUDA
        engine makes them (None when the batch has kernel runs)."""
        if plan.kernel:
            return None
        n = plan.dma
        columns = [
            np.ctypeslib.as_array((ctypes.c_int64 * n).from_address(a)).copy()
            for a in (plan.dma_dst, plan.dma_src, plan.dma_size)
        ]
        dst, src, size = (int(c.ctypes.data) for c in columns)
        stream = driver_stream.cuda_stream

        def submit() -> None:
            rt.memcpy_batch(dst, src, size, n, stream, source_settled=load)

        def call(columns: list[np.ndarray] = columns) -> Timed:  # holds the arrays at those addresses
            return host_time(submit, lambda: None)

        return call

    planner = copier._engine._planner  # type: ignore[union-attr]  # the CUDA engine's own planner
    same = [PlannedCopy(next(tickets), "k", e, rows) for e in extents]
    load_driver = driver_call(planner.load(same, out.data_ptr()), load=True)
    pointers, offsets = [p.data_ptr() for p in payloads], [p.storage_offset() for p in payloads]
    save_driver = driver_call(planner.save(same, pointers, offsets, payloads[0].element_size()), load=False)
    result: dict = {"case": name, "runs": sum(map(len, extents)), "entries": len(extents)}
    stolen = Steal()
    # Save and load in turn, call by call (the GPU machine's host load drifts over seconds, and
    # timing each in a block of its own let that drift pass for a difference between them); the
    # copier's own calls first, then the worker's: once the worker has started its watcher thread,
    # that thread polls the copier under the worker's lock, which the copier's own calls here do not
    # take (the copier is not thread-safe; in the connector only the worker calls it).
    copier_calls: dict[str, Callable[[], Timed]] = {
        "save": save,
        "save_inline": lambda: save(inline),
        "load": load,
    }
    worker_calls: dict[str, Callable[[], Timed]] = {
        "worker_save": worker_save,
        "worker_save_inline": lambda: worker_save(inline_worker),
        "worker_load": worker_load,
    }
    for prefix, calls in (("", copier_calls), ("worker_", worker_calls)):  # the driver's, in turn with each
        if load_driver is not None:
            calls[f"{prefix}load_driver"] = load_driver
        if save_driver is not None:
            calls[f"{prefix}save_driver"] = save_driver
    for pair in (copier_calls, worker_calls):
        for call in pair.values():
            for _ in range(20):
                call()
        times: dict[str, list[Timed]] = {label: [] for label in pair}
        for _ in range(iters):
            for label, call in pair.items():
                times[label].append(call())
        result.update({label: percentiles(xs) for label, xs in times.items()})
    result["bytes_ok"] = True
    for by in (inline, copier):
        save(by)
        load()
        result["bytes_ok"] &= all(torch.equal(a, b) for a, b in zip(loaded, payloads, strict=True))
    copies = [PlannedCopy(next(tickets), "k", e, rows) for e in extents]
    row_bytes = layout.block_size_bytes
    planner = BatchPlanner(  # the CUDA engine's plan of this batch's load, alone
        num_blocks=blocks,
        row_bytes=row_bytes,
        host_address=1 << 32,
        big_rows=None if dma_min_bytes is None else -(-dma_min_bytes // row_bytes),
        few_runs=FEW_RUNS,
        mixed_min_runs=MIXED_MIN_RUNS,
        base_align=row_bytes | 1 << 32,
    )
    xs = []
    for _ in range(iters):
        t0 = time.perf_counter()
        planner.load(copies, 1 << 40)
        xs.append(time.perf_counter() - t0)
    result["plan_us"] = statistics.median(xs) * 1e6
    result["steal_pct"] = stolen.percent()
    worker.close()
    inline_worker.close()
    region.close()
    return result


def floor_costs(iters: int, pacer: Pacer) -> dict[str, float]:
    """Host time of the parts that are not our code: the driver's copy submission, torch's split."""
    from ec_connector.adapters.torch_copy.cudart import runtime

    rt = runtime()
    stream = torch.cuda.Stream()
    size = 448 * 1024
    host = torch.empty(BATCH * size, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(BATCH * size, dtype=torch.uint8, device="cuda")
    dsts = np.array([host.data_ptr() + i * size for i in range(BATCH)], np.int64)
    srcs = np.array([dev.data_ptr() + i * size for i in range(BATCH)], np.int64)
    sizes = np.full(BATCH, size, np.int64)
    xs = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = pacer.start()
        rt.memcpy_many(dsts, srcs, sizes, stream.cuda_stream)
        xs.append(time.perf_counter() - t0)
    out = {"cudaMemcpyBatchAsync of 32 x 448 KiB": statistics.median(xs) * 1e6}
    torch.cuda.synchronize()
    del host, dev
    big = 16 << 20  # does the driver's submission cost grow with the bytes? (32 x 16 MiB, 1 x 512 MiB)
    host = torch.empty(BATCH * big, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(BATCH * big, dtype=torch.uint8, device="cuda")
    for label, count, size in (("32 x 16 MiB", BATCH, big), ("2 x 256 MiB", 2, BATCH * big // 2)):
        dsts = np.array([host.data_ptr() + i * size for i in range(count)], np.int64)
        srcs = np.array([dev.data_ptr() + i * size for i in range(count)], np.int64)
        sizes = np.full(count, size, np.int64)
        xs = []
        for _ in range(max(10, iters // 10)):
            torch.cuda.synchronize()
            t0 = pacer.start()
            rt.memcpy_many(dsts, srcs, sizes, stream.cuda_stream)
            xs.append(time.perf_counter() - t0)
        out[f"cudaMemcpyBatchAsync of {label}"] = statistics.median(xs) * 1e6
    torch.cuda.synchronize()
    del host, dev
    whole = torch.empty((BATCH * 64, 3584), dtype=torch.bfloat16, device="cuda")
    xs = []
    for _ in range(iters):
        t0 = time.perf_counter()
        whole.split([64] * BATCH)
        xs.append(time.perf_counter() - t0)
    out["torch split into 32 views"] = statistics.median(xs) * 1e6
    event = rt.event(timing=True)
    xs = []
    for _ in range(iters):
        t0 = time.perf_counter()
        rt.record(event, stream.cuda_stream)
        xs.append(time.perf_counter() - t0)
    out["cudaEventRecord"] = statistics.median(xs) * 1e6
    torch.cuda.synchronize()
    rt.destroy(event)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iters", type=int, default=200, help="timed calls per case (default 200)")
    parser.add_argument("--json", type=Path, default=None, help="write every number here")
    parser.add_argument(
        "--passes",
        type=int,
        default=1,
        help="run every case this many times in turn and also print each one's lowest median",
    )
    parser.add_argument(
        "--dma-min-bytes",
        default=str(DMA_MIN_BYTES),
        help=f"the copier's dma_min_bytes (default {DMA_MIN_BYTES}; 'none': every run to the kernel)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        help="time only the cases whose name contains this text (repeatable)",
    )
    parser.add_argument(
        "--period-ms",
        type=float,
        default=0.0,
        help="start each timed call this long after the previous one (default 0: at once); 12 gives "
        "every case the time since its previous call that 32 x 16 MiB copies take",
    )
    parser.add_argument(
        "--preamble",
        type=int,
        default=0,
        help="make this many 4 KiB host-to-device copies (untimed) right before each timed call, as "
        "vLLM's _prepare_inputs does before a step's loads (default 0)",
    )
    add_stream_option(parser)
    args = parser.parse_args(argv)
    dma_min = None if args.dma_min_bytes.lower() == "none" else int(args.dma_min_bytes)
    if not torch.cuda.is_available():
        sys.exit(
            "copy_host_launch needs a CUDA device "
            "(the CPU copier is synchronous: its host time is its copy time)"
        )
    print(
        f"# {torch.cuda.get_device_name()} torch {torch.__version__}; "
        f"batch of {BATCH} entries, {args.iters} calls, dma_min_bytes {dma_min}, "
        f"callers on {'a stream of their own' if args.stream == 'own' else 'the legacy default stream'}, "
        f"{f'a call every {args.period_ms:g} ms' if args.period_ms else 'each call right after the last'}"
        f"{f', {args.preamble} input copies before each' if args.preamble else ''}"
    )
    pacer = Pacer(args.period_ms / 1e3, args.preamble)
    passes: list[list[dict]] = []
    floors: dict[str, float] = {}
    own = torch.cuda.Stream() if args.stream == "own" else torch.cuda.default_stream()
    with torch.inference_mode(), torch.cuda.stream(own):
        layouts = cases(random.Random(1))  # aged once: every pass times the same batches
        if args.only:
            layouts = [case for case in layouts if any(text in case[0] for text in args.only)]
            if not layouts:
                sys.exit(f"no case name contains any of {args.only}")
        for k in range(args.passes):
            if args.passes > 1:
                print(f"# pass {k + 1} of {args.passes}", flush=True)
            rows = []
            for name, width, n_rows, extents, blocks in layouts:
                r = measure(name, width, n_rows, extents, blocks, args.iters, dma_min, pacer)
                rows.append(r)
                print_case(r)
            passes.append(rows)
            floors = floor_costs(args.iters, pacer)
            for what, us in floors.items():
                print(f"  not ours: {what:40s} {us:6.1f} us", flush=True)
    if args.passes > 1:
        print_best(passes)
    if not all(r["bytes_ok"] for rows in passes for r in rows):
        sys.exit("bytes differ after a copy")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "period_ms": args.period_ms,
                    "preamble": args.preamble,
                    "passes": passes,
                    "floors_us": floors,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
