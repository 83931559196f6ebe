"""Loads through the copy launcher in a consumer's step: does the step get shorter, or only the load?

`bench/copy_host_launch.py` times a load's launch alone. With `TorchCopier(load_launcher=True)` the
launcher's native thread makes the driver call of a load wholly on the copy engines, and the
caller's stream waits for a word the launcher's stream writes after the copies. The driver
serializes its work with the step thread's own CUDA calls, so what the launch saves may be paid by
the calls after it. Here each step runs, through `TierWorker` over a /dev/shm region, as a vLLM
consumer's step would:

    6 small input copies (`_prepare_inputs`) | load of 32 aged entries (start_loads) |
    [--gap-us of Python: the encoder's and the gather's bookkeeping] | 30 small kernel launches (the
    model) | synchronize (the sampler's wait) | ~2 ms of Python (the scheduler) | end of step (clear)

with the launcher and with the step thread's own driver call (the baseline), in turn, round by
round, in one process. It prints the median/p10 host µs of the load, of the launches after it, of
the two together, and of the step from the load's call to the device done (the copies, the model's
kernels, and any delay the hand-over to the launcher's thread adds on the device), and the
launcher's ratios to the baseline.

    python bench/load_launcher_step.py                 # needs CUDA; gaps 0 and 100 µs
    python bench/load_launcher_step.py --rows 146 512 2340 --rounds 5
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
from bench.save_launcher_step import BATCH, WIDTH, cell, python_work  # noqa: E402
from ec_connector.adapters.shm import ShmRegion  # noqa: E402
from ec_connector.adapters.torch_copy import TorchCopier  # noqa: E402
from ec_connector.application.worker import TierWorker  # noqa: E402
from ec_connector.domain.config import Role  # noqa: E402
from ec_connector.domain.layout import Layout  # noqa: E402
from ec_connector.domain.transfers import PlannedCopy, SaveJob, StepPlan  # noqa: E402
from ec_connector.logging import configure_logging  # noqa: E402

PARTS = ("load", "launches after", "both", "to device done")


def measure(
    rows: int, gap_us: float, rounds: int, steps: int, shm_dir: Path
) -> dict[str, dict[str, list[float]]]:
    blocks = int(BATCH * rows * 2.2) + 64
    extents = aged(blocks, rows, BATCH, random.Random(1), row_bytes=WIDTH * 2)
    layout = Layout(hidden_dim=WIDTH, dtype="bfloat16", num_blocks=blocks)
    payloads = [torch.randn(rows, WIDTH, device="cuda").to(torch.bfloat16) for _ in range(BATCH)]
    inputs = [
        (torch.zeros(1024, dtype=torch.int32, pin_memory=True), torch.zeros(1024, device="cuda"))
        for _ in range(6)
    ]
    small = torch.zeros(1024, device="cuda")
    tickets = iter(range(1, 1 << 60))
    variants = {"launcher": True, "step thread": False}
    times: dict[str, dict[str, list[float]]] = {v: {p: [] for p in PARTS} for v in variants}
    for r in range(rounds):
        for name, launcher in variants.items():
            region = ShmRegion.open(
                instance=f"ll{r}{int(launcher)}", dp_rank=0, layout=layout, shm_dir=str(shm_dir)
            )
            copier = TorchCopier(region, device="cuda", load_launcher=launcher)
            copier.save(
                [
                    SaveJob(PlannedCopy(next(tickets), f"k{i}", e, rows), p)
                    for i, (e, p) in enumerate(zip(extents, payloads, strict=True))
                ]
            )
            while copier.in_flight():
                copier.poll()
            worker = TierWorker(role=Role.CONSUMER, rank=0, writer=True, region=region, copier=copier)
            loaded: dict = {}
            try:
                for step in range(steps + 5):
                    loads = tuple(PlannedCopy(next(tickets), f"k{i}", e, rows) for i, e in enumerate(extents))
                    loaded.clear()
                    for host, device in inputs:
                        device.copy_(host, non_blocking=True)
                    t0 = time.perf_counter()
                    worker.bind(StepPlan(loads=loads))
                    worker.start_loads(loaded)
                    t1 = time.perf_counter()
                    python_work(gap_us * 1e-6)
                    t2 = time.perf_counter()
                    for _ in range(30):
                        small.add_(1.0)
                    t3 = time.perf_counter()
                    torch.cuda.synchronize()
                    t4 = time.perf_counter()
                    python_work(2e-3)
                    worker.clear()
                    region.drain_completions()
                    if step == 0:
                        assert all(torch.equal(loaded[f"k{i}"], p) for i, p in enumerate(payloads)), "bytes"
                    if step >= 5:  # warm-up steps are not counted
                        took = times[name]
                        took["load"].append(t1 - t0)
                        took["launches after"].append(t3 - t2)
                        took["both"].append((t1 - t0) + (t3 - t2))
                        took["to device done"].append(t4 - t0)
            finally:
                worker.close()  # and its copier
                region.close()
    torch.cuda.synchronize()
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rows", type=int, nargs="+", default=[146, 512, 2340], help="rows per entry (7 KiB rows)"
    )
    parser.add_argument("--gap-us", type=float, nargs="+", default=[0.0, 100.0], help="Python after the load")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each variant, in turn")
    parser.add_argument("--steps", type=int, default=40, help="counted steps per round")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("load_launcher_step needs a CUDA device (the launcher queues CUDA copies)")
    configure_logging(level="WARNING")  # not the regions' creation and join lines
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}; batches of {BATCH}; median/p10 us")
    own = torch.cuda.Stream()  # vLLM's model runner calls from a stream of its own
    with torch.inference_mode(), torch.cuda.stream(own), scratch_shm_dir("ec_load_launcher_step") as shm_dir:
        for rows in args.rows:
            for gap in args.gap_us:
                times = measure(rows, gap, args.rounds, args.steps, shm_dir)
                mib = rows * WIDTH * 2 / 2**20
                print(f"{rows} rows ({mib:.2f} MiB) aged, {gap:.0f} us of Python after the load")
                for name, took in times.items():
                    cells = "  ".join(f"{part} {cell(xs)}" for part, xs in took.items())
                    print(f"  {name:11s} {cells}", flush=True)
                launched, inline = times["launcher"], times["step thread"]
                ratios = "  ".join(
                    f"{part} {statistics.median(launched[part]) / statistics.median(inline[part]):.2f}"
                    for part in PARTS
                )
                print(f"  launcher / step thread (medians): {ratios}", flush=True)


if __name__ == "__main__":
    main()
