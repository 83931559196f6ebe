"""The save launcher in a step-like pattern: does it shorten the step, or only the flush?

`bench/copy_host_launch.py` times a save's launch alone. The launcher (`TorchCopier(save_launcher=
True)`, launcher.c) takes the driver's part of that launch off the step thread, but the driver
serializes its work with the step thread's own CUDA calls. Here each step runs, through `TierWorker`
over a /dev/shm region, as a vLLM step would:

    load of 32 aged entries (start_loads) | ~2 ms of Python | save of the same 32 and its flush |
    [--gap-us of Python] | 30 small kernel launches | [--end-sync: wait for the device] |
    ~2 ms of Python | end of step (clear)

with the launcher and with the step thread's own driver call (the baseline), in turn, round by
round, in one process. It prints the median/p10 host µs of the flush, of the launches after it and
of the three together, and the launcher's ratio to the baseline. With no gap (a prefill instance:
the model's launches follow the flush) the launches pay what the flush saved; with a gap (an
encoder-only instance, whose step ends at the flush) they do not. docs/benchmarks.md, session 12.

    python bench/save_launcher_step.py                 # needs CUDA; gaps 0 and 300 µs
    python bench/save_launcher_step.py --rows 146 1170 --rounds 5

`--end-sync` waits for the device after the launches, as vLLM's model runner does each step when it
reads the sampled tokens: the next step's load then comes ~2 ms after an idle device, as in an
engine, and the device's work never piles up across steps (without it, batches of large entries
queue more copies per step than ~4 ms of Python lets the device finish).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import scratch_shm_dir  # noqa: E402
from bench.copy_bandwidth import aged  # noqa: E402
from ec_connector.adapters.shm import ShmRegion  # noqa: E402
from ec_connector.adapters.torch_copy import TorchCopier  # noqa: E402
from ec_connector.application.worker import TierWorker  # noqa: E402
from ec_connector.domain.config import Role  # noqa: E402
from ec_connector.domain.layout import Layout  # noqa: E402
from ec_connector.domain.transfers import PlannedCopy, StepPlan  # noqa: E402
from ec_connector.logging import configure_logging  # noqa: E402

BATCH = 32
WIDTH = 3584  # 7 KiB rows of bfloat16
PARTS = ("load", "save+flush", "launches after", "all three")


def python_work(seconds: float) -> None:
    """Busy Python for about `seconds` (holds the GIL, makes no CUDA call)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure(
    rows: int, gap_us: float, rounds: int, steps: int, shm_dir: Path, *, end_sync: bool = False
) -> dict[str, dict[str, list[float]]]:
    blocks = int(BATCH * rows * 2.2) + 64
    extents = aged(blocks, rows, BATCH, random.Random(1), row_bytes=WIDTH * 2)
    layout = Layout(hidden_dim=WIDTH, dtype="bfloat16", num_blocks=blocks)
    payloads = [torch.randn(rows, WIDTH, device="cuda").to(torch.bfloat16) for _ in range(BATCH)]
    cache = {f"k{i}": p for i, p in enumerate(payloads)}
    small = torch.zeros(1024, device="cuda")
    tickets = iter(range(1, 1 << 60))
    variants = {"launcher": True, "step thread": False}
    times: dict[str, dict[str, list[float]]] = {v: {p: [] for p in PARTS} for v in variants}
    for r in range(rounds):
        for name, launcher in variants.items():
            region = ShmRegion.open(
                instance=f"sl{r}{int(launcher)}", dp_rank=0, layout=layout, shm_dir=str(shm_dir)
            )
            copier = TorchCopier(region, device="cuda", save_launcher=launcher)
            worker = TierWorker(role=Role.BOTH, rank=0, writer=True, region=region, copier=copier)
            loaded: dict = {}
            try:
                for step in range(steps + 5):
                    saves = tuple(
                        PlannedCopy(next(tickets), k, e, rows) for k, e in zip(cache, extents, strict=True)
                    )
                    loads = tuple(
                        PlannedCopy(next(tickets), k, e, rows) for k, e in zip(cache, extents, strict=True)
                    )
                    loaded.clear()
                    t0 = time.perf_counter()
                    worker.bind(StepPlan(saves=saves, loads=loads))
                    worker.start_loads(loaded)
                    t1 = time.perf_counter()
                    python_work(2e-3)
                    t2 = time.perf_counter()
                    for key in cache:
                        worker.save(cache, key)
                    worker.flush()
                    t3 = time.perf_counter()
                    python_work(gap_us * 1e-6)
                    t4 = time.perf_counter()
                    for _ in range(30):
                        small.add_(1.0)
                    t5 = time.perf_counter()
                    if end_sync:
                        torch.cuda.synchronize()
                    python_work(2e-3)
                    worker.clear()
                    region.drain_completions()
                    if step >= 5:  # warm-up steps are not counted
                        took = times[name]
                        took["load"].append(t1 - t0)
                        took["save+flush"].append(t3 - t2)
                        took["launches after"].append(t5 - t4)
                        took["all three"].append((t1 - t0) + (t3 - t2) + (t5 - t4))
            finally:
                worker.close()
                region.close()
    torch.cuda.synchronize()
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rows", type=int, nargs="+", default=[146, 1170], help="rows per entry (7 KiB rows)"
    )
    parser.add_argument(
        "--gap-us", type=float, nargs="+", default=[0.0, 300.0], help="Python after the flush"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each variant, in turn")
    parser.add_argument("--steps", type=int, default=60, help="counted steps per round")
    parser.add_argument(
        "--end-sync", action="store_true", help="wait for the device after each step's launches"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("save_launcher_step needs a CUDA device (the launcher queues CUDA copies)")
    configure_logging(level="WARNING")  # not the regions' creation and join lines
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}; batches of {BATCH}; median/p10 us")
    with torch.inference_mode(), scratch_shm_dir("ec_launcher_step") as shm_dir:
        for rows in args.rows:
            for gap in args.gap_us:
                times = measure(rows, gap, args.rounds, args.steps, shm_dir, end_sync=args.end_sync)
                mib = rows * WIDTH * 2 / 2**20
                synced = ", the device waited for at each step's end" if args.end_sync else ""
                print(f"{rows} rows ({mib:.1f} MiB) aged, {gap:.0f} us of Python after the flush{synced}")
                for name, took in times.items():
                    cells = "  ".join(f"{part} {cell(xs)}" for part, xs in took.items())
                    print(f"  {name:11s} {cells}", flush=True)
                ratio = statistics.median(times["launcher"]["all three"]) / statistics.median(
                    times["step thread"]["all three"]
                )
                print(f"  launcher / step thread, all three (median): {ratio:.2f}", flush=True)


def cell(xs: list[float]) -> str:
    ordered = sorted(xs)
    return f"{statistics.median(ordered) * 1e6:6.1f}/{ordered[len(ordered) // 10] * 1e6:6.1f}"


if __name__ == "__main__":
    main()
