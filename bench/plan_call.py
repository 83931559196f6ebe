"""Host time of the CUDA engine's batch planner call, warm and with a cold cache; runs on any CPU.

The step thread plans and queues each copy-engine batch in one call into batchplan.c
(`BatchPlanner.load_queued`/`save_queued`). Here that call runs against entry points that return at
once (a no-op CUDA runtime compiled for the bench), so it times our code alone: the Python around the
call, the call itself and the plan. A batch is 32 entries placed by the tier's own aged table
(`bench/copy_bandwidth.aged`). Each timing is the median (and p10) of `--iters` calls made:

- back to back ("warm");
- each after sweeping `--sweep-mib` of memory with the CPU ("cold"), with the batch's copies touched
  after the sweep, as a step's plan is just unpickled when the worker launches it.

A launch on the step thread follows milliseconds of other work, so the cold figure is the one the
engine pays (docs/benchmarks.md, "Host launch time": a launch's host time grows with the gap before it).
Compare trees by running this file in each, in turn:

    python bench/plan_call.py
    python bench/plan_call.py --iters 400 --json plan.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.copy_bandwidth import aged  # noqa: E402
from ec_connector.adapters.torch_copy.copier import DMA_MIN_BYTES  # noqa: E402
from ec_connector.adapters.torch_copy.cuda import FEW_RUNS, FEW_RUNS_SAVE, FEW_SHORT, MIXED_MIN_RUNS  # noqa: E402
from ec_connector.adapters.torch_copy.native import build as native  # noqa: E402
from ec_connector.adapters.torch_copy.native.batchplan import BatchPlanner, Queue  # noqa: E402
from ec_connector.domain.transfers import PlannedCopy  # noqa: E402

NOOP_RUNTIME = """
#include <stddef.h>
int ec_noop_wait(void *stream, void *event, unsigned flags) { return 0; }
int ec_noop_record(void *event, void *stream) { return 0; }
int ec_noop_memcpy(void *dst, const void *src, size_t n, int kind, void *stream) { return 0; }
int ec_noop_batch(void *d, void *s, void *n, size_t count, void *a, void *i, size_t na, void *st) {
    return 0;
}
"""
BATCH, ROW_BYTES = 32, 7168
ENTRIES = {"64 rows": 64, "1 MiB": 146, "16 MiB": 2340}


def noop_driver() -> tuple[ctypes.CDLL, np.ndarray]:
    """queue.h's driver table over entry points that do nothing (cudart.driver_table's layout)."""
    folder = Path(tempfile.mkdtemp(prefix="ec_plan_call_"))
    source = folder / "noop_runtime.c"
    source.write_text(NOOP_RUNTIME)
    lib = ctypes.CDLL(str(native.build(source, "the bench's no-op runtime")))
    names = ("wait", "record", "memcpy", "batch")
    address = [ctypes.cast(getattr(lib, f"ec_noop_{n}"), ctypes.c_void_p).value or 0 for n in names]
    return lib, np.array([*address, 0, 256, 0x1D0], dtype=np.int64)


def timed(fn: Callable[[], object], iters: int, before: Callable[[], None] | None) -> dict[str, float]:
    xs = []
    for _ in range(iters + iters // 10):  # the first tenth warms up
        if before is not None:
            before()
        t0 = time.perf_counter_ns()
        fn()
        xs.append(time.perf_counter_ns() - t0)
    xs = sorted(xs[iters // 10 :])
    return {"median_us": statistics.median(xs) / 1e3, "p10_us": xs[len(xs) // 10] / 1e3}


def measure(
    rows: int, table: np.ndarray, sweep: np.ndarray, iters: int
) -> tuple[int, dict[str, dict[str, float]]]:
    """(runs, timings) of one 32-entry batch of `rows` rows each."""
    blocks = int(BATCH * rows * 2.2) + 64
    extents = aged(blocks, rows, BATCH, random.Random(rows), row_bytes=ROW_BYTES)
    copies = [PlannedCopy(i + 1, f"k{i}", e, rows) for i, e in enumerate(extents)]
    host = 1 << 32
    planner = BatchPlanner(
        num_blocks=blocks,
        row_bytes=ROW_BYTES,
        host_address=host,
        big_rows=-(-DMA_MIN_BYTES // ROW_BYTES),
        few_runs=FEW_RUNS,
        few_runs_save=FEW_RUNS_SAVE,
        mixed_min_runs=MIXED_MIN_RUNS,
        few_short=FEW_SHORT,
        short_per_copy=1,
        base_align=ROW_BYTES | host,
        driver=(int(table.ctypes.data), 0xA1, 0xA2),
    )
    own = Queue(0xC0, 0xC0, 0xFE, 0x57, 0xE0)  # a load onto the caller's own stream
    apart = Queue(0xC0, 0x5E, 0xFE, 0x57, 0xE0)  # a save on a copy stream, fenced
    pointers, offsets = [1 << 40] * BATCH, [0] * BATCH

    def load() -> object:
        return planner.load_queued(copies, 1 << 41, own)

    def save() -> object:
        return planner.save_queued(copies, pointers, offsets, 2, apart)

    def cold() -> None:
        np.add(sweep, 1, out=sweep)
        for c in copies:  # a step's plan is freshly unpickled: its objects are in cache
            c.packed, c.rows, c.ticket  # noqa: B018

    assert load() is None and save() is None, "the bench's batch must go wholly to the copy engines"
    timings = {
        f"{kind} {heat}": timed(fn, iters, before)
        for kind, fn in (("load", load), ("save", save))
        for heat, before in (("warm", None), ("cold", cold))
    }
    return sum(len(e) for e in extents), timings


def run(args: argparse.Namespace) -> dict[str, dict[str, dict[str, float]]]:
    lib, table = noop_driver()
    sweep = np.zeros(args.sweep_mib << 20, dtype=np.uint8)
    results: dict[str, dict[str, dict[str, float]]] = {}
    for name, rows in ENTRIES.items():
        runs, results[name] = measure(rows, table, sweep, args.iters)
        line = "  ".join(
            f"{k} {v['median_us']:6.2f} (p10 {v['p10_us']:6.2f})" for k, v in results[name].items()
        )
        print(f"32 x {name:7s} of 7 KiB rows, aged, {runs:3d} runs | {line}", flush=True)
    del lib
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--sweep-mib", type=int, default=64, help="memory swept before each cold call")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    print("# µs per call, median (p10); warm: back to back; cold: after a sweep of host memory")
    results = run(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
