"""Where a batch's short runs go when it also has long ones: the copy kernel, or the copy engines.

Runs of at least `dma_min_bytes` go to the copy engines. A batch that also has shorter runs can send
them to the copy kernel beside the engines (a kernel launch and the join of two streams), or send the
whole batch to the engines (a descriptor per short run). The copier sends the whole batch to the
engines when it has at most `cuda.FEW_SHORT` short runs or one per entry, the most the tier's run
floor leaves (the last piece of a split entry, or an entry under the floor). Here three rules run
side by side on the same batches, call by call in turn (the GPU machine's host load drifts over
seconds, so blocks of calls per rule would time the drift):

    kernel      every short run to the kernel
    per-entry   at most FEW_SHORT short runs, or one per entry, to the engines (the copier's rule)
    engines     every batch with a long run wholly to the engines

For saves and loads of each case it prints, per rule, the host time of the `save`/`load` call (p10 and
median, µs), the device time between the copier's own events (median, ms; each call gated behind a
spin kernel, so that the host's enqueue is not timed) and the ratio of a contiguous pinned memcpy of
the same bytes, gated alike, to it. Loads' bytes are checked against the payloads every few rounds.

    python bench/copy_short_runs.py              # needs CUDA
    python bench/copy_short_runs.py --quick --rounds 20
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.copy_bandwidth import Device, aged, churn, finish, scattered  # noqa: E402
from ec_connector.adapters.memory import MemoryRegion  # noqa: E402
from ec_connector.adapters.torch_copy import TorchCopier, cuda  # noqa: E402
from ec_connector.domain.blocks import Extent  # noqa: E402
from ec_connector.domain.layout import Layout  # noqa: E402
from ec_connector.domain.transfers import PlannedCopy, SaveJob  # noqa: E402

RULES = {  # (FEW_SHORT, SHORT_PER_COPY)
    "kernel": (0, 0),
    "per-entry": (cuda.FEW_SHORT, cuda.SHORT_PER_COPY),
    "engines": (1 << 62, 0),
}
PLACEMENTS: dict[str, Callable[[int, int, int, random.Random, int], list[tuple[Extent, ...]]]] = {
    "aged": lambda blocks, rows, count, rng, row_bytes: aged(blocks, rows, count, rng, row_bytes=row_bytes),
    "churn": lambda blocks, rows, count, rng, row_bytes: churn(blocks, rows, count, rng),
    "runs1-16": lambda blocks, rows, count, rng, row_bytes: scattered(blocks, rows, count, rng),
}
# (placement, bf16 width, rows per entry, batch): the tier's aged layout at every row size and
# several entry sizes; churn (the allocator without the floor); runs1-16 (the floor-off worst case)
CASES = (
    ("aged", 1024, 512, 32),
    ("aged", 3584, 146, 32),
    ("aged", 3584, 1170, 32),
    ("aged", 3584, 2340, 32),
    ("aged", 16384, 512, 32),
    ("aged", 1024, 64, 32),
    ("aged", 3584, 64, 32),
    ("aged", 16384, 64, 32),
    ("aged", 3584, 146, 1),
    ("churn", 3584, 146, 32),
    ("churn", 16384, 32, 32),
    ("runs1-16", 16384, 32, 32),
    ("runs1-16", 16384, 512, 32),
)
QUICK = (("aged", 3584, 146, 32), ("aged", 3584, 1170, 32), ("runs1-16", 16384, 32, 32))


@contextlib.contextmanager
def rule(name: str) -> Iterator[None]:
    """The copier's short-run constants set to `name`'s while a copier is built (its planner reads them)."""
    kept = cuda.FEW_SHORT, cuda.SHORT_PER_COPY
    cuda.FEW_SHORT, cuda.SHORT_PER_COPY = RULES[name]
    try:
        yield
    finally:
        cuda.FEW_SHORT, cuda.SHORT_PER_COPY = kept


def measure(
    dev: Device, placement: str, width: int, rows: int, batch: int, rounds: int, seed: int
) -> list[str]:
    rng = random.Random(seed)
    count = max(batch, 32)  # batch-1 entries are placed among 32, as the bandwidth bench places them
    blocks = (count + 8) * rows if placement == "runs1-16" else int(count * rows * 2.2) + 64
    extents = PLACEMENTS[placement](blocks, rows, count, rng, width * 2)[:batch]
    runs = sum(map(len, extents))
    gen = torch.Generator(device=dev.device).manual_seed(seed)
    payloads = [
        torch.randn(rows, width, device=dev.device, generator=gen).to(torch.bfloat16) for _ in extents
    ]
    tickets = iter(range(1, 1 << 62))
    regions, copiers = {}, {}
    for name in RULES:
        regions[name] = MemoryRegion(Layout(hidden_dim=width, dtype="bfloat16", num_blocks=blocks))
        with rule(name):
            copiers[name] = TorchCopier(regions[name], device=dev.device)
    pinned, dense = dev.buffers(sum(p.numel() * p.element_size() for p in payloads))
    kinds = [(d, name) for d in ("save", "load") for name in RULES] + [("save", "memcpy"), ("load", "memcpy")]
    host: dict[tuple[str, str], list[float]] = {k: [] for k in kinds}
    device: dict[tuple[str, str], list[float]] = {k: [] for k in kinds}
    loaded: list[object] = []
    for r in range(rounds + 3):  # the first 3 warm up
        for d, name in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
            loaded.clear()
            dev.sync()
            if name == "memcpy":
                seconds, dt = dev.memcpy(*((pinned, dense) if d == "save" else (dense, pinned))), 0.0
            else:
                copier = copiers[name]
                copies = [PlannedCopy(next(tickets), "k", e, rows) for e in extents]
                jobs = [SaveJob(c, p) for c, p in zip(copies, payloads, strict=True)] if d == "save" else []
                dev.hold()
                t0 = time.perf_counter()
                if jobs:
                    copier.save(jobs)
                else:
                    loaded[:] = copier.load(copies)
                dt = time.perf_counter() - t0
                seconds = finish(dev, copier, copies)
                if d == "load" and r % 5 == 0:
                    outputs = cast(list[torch.Tensor], loaded)
                    assert all(torch.equal(a, b) for a, b in zip(outputs, payloads, strict=True)), (
                        f"{name}: loaded bytes differ from the saved payloads"
                    )
            if r >= 3:
                host[(d, name)].append(dt * 1e6)
                device[(d, name)].append(seconds)
    loaded.clear()
    for name in RULES:
        copiers[name].close()
        regions[name].close()
    label = f"{placement} {width * 2 // 1024}K x {rows} rows, batch {batch} ({runs / batch:.1f} runs/entry)"
    out = []
    for d in ("save", "load"):
        memcpy = statistics.median(device[(d, "memcpy")])
        cells = []
        for name in RULES:
            hs = sorted(host[(d, name)])
            p10, median = hs[len(hs) // 10], statistics.median(hs)
            ds = statistics.median(device[(d, name)])
            cells.append(f"{name} {p10:5.0f}/{median:5.0f} us {ds * 1e3:7.3f} ms {memcpy / ds:4.2f}")
        out.append(f"{label:48s} {d}  memcpy {memcpy * 1e3:7.3f} ms | " + " | ".join(cells))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=40, help="timed calls per rule and direction")
    parser.add_argument("--quick", action="store_true", help=f"{len(QUICK)} cases instead of {len(CASES)}")
    parser.add_argument("--gate-us", type=float, default=1000.0, help="spin before each timed call (µs)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("copy_short_runs needs a CUDA device (on CPU every run is a plain tensor copy)")
    dev = Device("cuda")
    dev.set_gate(args.gate_us)
    print(
        f"# {torch.cuda.get_device_name()} torch {torch.__version__}; {args.rounds} rounds, "
        f"gate {args.gate_us:g} us; per rule: host p10/median us, device median ms, memcpy/copy"
    )
    with torch.inference_mode():
        for i, case in enumerate(QUICK if args.quick else CASES):
            for line in measure(dev, *case, args.rounds, seed=i):
                print(line, flush=True)


if __name__ == "__main__":
    main()
