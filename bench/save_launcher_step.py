"""The save launcher in a step-like pattern: does it shorten the step, or only the flush?

`bench/copy_host_launch.py` times a save's launch alone. The launcher (`TorchCopier(save_launcher=
True)`, launcher.c) takes the driver's part of that launch off the step thread, but the driver
may serialize its work with the step thread's own CUDA calls. Here each step runs, through `TierWorker`
over a /dev/shm region, on a stream of the caller's own (`--stream default`: the legacy default
stream), as a vLLM step would:

    load of 32 aged entries (start_loads) | [--encoder-us of device work: the encoder] |
    ~2 ms of Python | save of the same 32 and its flush | [--gap-us of Python] |
    30 small kernel launches (the model) | [--end-sync: wait for the caller's stream] |
    ~2 ms of Python | end of step (clear)

with the launcher and with the step thread's own driver call (the baseline), in turn, round by
round, in one process. It prints the median/p10 host µs of the load, of the save and its flush, of
the launches after it and of the three together, and the launcher's ratio to the baseline. From the
legacy default stream (`--stream default`) the launches right after the
flush paid what the flush saved; from a stream of the caller's own, as vLLM's model runner calls,
they do not. docs/benchmarks.md, "A step with the save launcher".

    python bench/save_launcher_step.py                 # needs CUDA; gaps 0 and 300 µs
    python bench/save_launcher_step.py --rows 146 1170 --rounds 5
    python bench/save_launcher_step.py --gap-us 0 --encoder-us 4000 --end-sync
    python bench/save_launcher_step.py --stream default   # from the legacy default stream

`--encoder-us` queues that much device work on the caller's stream right after the load, standing
for the encoder whose outputs the step then saves (in vLLM, `save_caches` follows the encoder's
launches long before the device has run them). `--end-sync` waits for the caller's stream after the
launches, as vLLM's model runner does each step when it reads the sampled tokens: the next step's
load then comes ~2 ms after the device has caught up, as in an engine.
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


def sleep_cycles_per_us() -> float:
    """GPU clock cycles of `torch.cuda._sleep` per µs on this device (measured with events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # warm-up
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / (start.elapsed_time(end) * 1e3)


VARIANTS = {"step thread": False, "launcher": True}


def measure(
    rows: int,
    gap_us: float,
    rounds: int,
    steps: int,
    shm_dir: Path,
    *,
    end_sync: bool = False,
    encoder_cycles: int = 0,
) -> dict[str, dict[str, list[float]]]:
    blocks = int(BATCH * rows * 2.2) + 64
    extents = aged(blocks, rows, BATCH, random.Random(1), row_bytes=WIDTH * 2)
    layout = Layout(hidden_dim=WIDTH, dtype="bfloat16", num_blocks=blocks)
    payloads = [torch.randn(rows, WIDTH, device="cuda").to(torch.bfloat16) for _ in range(BATCH)]
    cache = {f"k{i}": p for i, p in enumerate(payloads)}
    small = torch.zeros(1024, device="cuda")
    tickets = iter(range(1, 1 << 60))
    times: dict[str, dict[str, list[float]]] = {v: {p: [] for p in PARTS} for v in VARIANTS}
    caller = torch.cuda.current_stream()
    for r in range(rounds):
        for n, (name, launcher) in enumerate(VARIANTS.items()):
            region = ShmRegion.open(instance=f"sl{r}{n}", dp_rank=0, layout=layout, shm_dir=str(shm_dir))
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
                    if encoder_cycles:
                        torch.cuda._sleep(encoder_cycles)
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
                        caller.synchronize()
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
        "--end-sync", action="store_true", help="wait for the caller's stream after each step's launches"
    )
    parser.add_argument(
        "--encoder-us", type=float, default=0.0, help="device work queued right after the load (µs)"
    )
    parser.add_argument(
        "--stream",
        choices=("own", "default"),
        default="own",
        help="the caller's stream: one of its own, as vLLM's model runner has (default), or the legacy "
        "default stream",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("save_launcher_step needs a CUDA device (the launcher queues CUDA copies)")
    configure_logging(level="WARNING")  # not the regions' creation and join lines
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}; batches of {BATCH}; median/p10 us")
    # vLLM's model runner works on a stream of its own
    caller = torch.cuda.Stream() if args.stream == "own" else torch.cuda.default_stream()
    with torch.inference_mode(), torch.cuda.stream(caller), scratch_shm_dir("ec_launcher_step") as shm_dir:
        cycles = int(args.encoder_us * sleep_cycles_per_us())
        for rows in args.rows:
            for gap in args.gap_us:
                times = measure(
                    rows, gap, args.rounds, args.steps, shm_dir, end_sync=args.end_sync, encoder_cycles=cycles
                )
                mib = rows * WIDTH * 2 / 2**20
                encoder = f", {args.encoder_us:.0f} us of encoder on the device" if cycles else ""
                synced = ", the caller's stream waited for at each step's end" if args.end_sync else ""
                legacy = ", from the legacy default stream" if args.stream == "default" else ""
                what = f"{gap:.0f} us of Python after the flush{encoder}{synced}{legacy}"
                print(f"{rows} rows ({mib:.1f} MiB) aged, {what}")
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
