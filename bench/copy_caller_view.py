"""A load as the caller's stream sees it: from the stream reaching `load()` to the stream past it.

`bench/copy_bandwidth.py` times a batch between the copier's own start and end events. Where those
sit depends on the path: a load fenced onto a copy stream starts its window after the hand-over
from the caller's stream, a load on the caller's own stream before it. What the engine's next kernel
waits for is neither: it is the time from the caller's stream reaching the load to its stream being
free to run what comes next. This bench puts a timing event on the caller's stream before and after
`load()` (the stream held first by a spin kernel, `--gate-us`, so both events time device work
only), for a caller on a stream of its own (vLLM's model runner; the load goes onto that stream)
and on the legacy default stream (the load is fenced onto a copy stream and joined back), beside
one contiguous `copy_` of the same bytes on the same stream. Two rounds of each, lowest median.
Entries are placed by the tier's aged table (`bench/copy_bandwidth.aged`).

    python bench/copy_caller_view.py          # needs CUDA
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.copy_bandwidth import Device, aged, entry_rows, finish  # noqa: E402
from ec_connector.adapters.memory import MemoryRegion  # noqa: E402
from ec_connector.adapters.torch_copy import TorchCopier  # noqa: E402
from ec_connector.domain.blocks import Extent  # noqa: E402
from ec_connector.domain.layout import Layout  # noqa: E402
from ec_connector.domain.transfers import PlannedCopy  # noqa: E402

CASES = (("64rows", 1), ("1MiB", 1), ("1MiB", 32), ("16MiB", 1), ("16MiB", 32))


def caller_view(
    dev: Device,
    copier: TorchCopier,
    place: list[tuple[Extent, ...]],
    rows: int,
    row_bytes: int,
    stream: torch.cuda.Stream,
    reps: int,
) -> tuple[float, float]:
    """(load, copy_) µs medians seen from `stream`, the copy_ of the same bytes on the same stream."""
    tickets = itertools.count(1)
    nbytes = rows * row_bytes * len(place)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dense = torch.empty(nbytes, dtype=torch.uint8, device=dev.device)
    before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    loads, copies_ = [], []
    with torch.cuda.stream(stream):
        for _ in range(reps + 2):  # two warm-up rounds
            copies = [PlannedCopy(next(tickets), f"e{j}", ext, rows) for j, ext in enumerate(place)]
            dev.sync()
            dev.hold()
            before.record()
            out = copier.load(copies)
            after.record()
            finish(dev, copier, copies)
            del out
            loads.append(before.elapsed_time(after) * 1e3)
            dev.sync()
            dev.hold()
            before.record()
            dense.copy_(pinned, non_blocking=True)
            after.record()
            dev.sync()
            copies_.append(before.elapsed_time(after) * 1e3)
    return statistics.median(loads[2:]), statistics.median(copies_[2:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gate-us", type=float, default=2000.0)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--widths", type=int, nargs="*", default=[3584, 1024])
    args = parser.parse_args(argv)
    dev = Device("cuda")
    dev.set_gate(args.gate_us)
    print("# µs from the caller's stream reaching load() to its stream past it (lowest of two medians)")
    for width in args.widths:
        row_bytes = width * 2
        for entry, batch in CASES:
            rows = entry_rows(entry, row_bytes)
            blocks = int(rows * batch * 2.2) + 64
            region = MemoryRegion(Layout(hidden_dim=width, dtype="bfloat16", num_blocks=blocks), name="view")
            copier = TorchCopier(region, device=dev.device)
            place = aged(blocks, rows, batch, random.Random(1), row_bytes=row_bytes)
            seen: dict[str, list[tuple[float, float]]] = {}
            for mode in ("own", "default", "own", "default"):
                stream = torch.cuda.Stream() if mode == "own" else torch.cuda.default_stream()
                seen.setdefault(mode, []).append(
                    caller_view(dev, copier, place, rows, row_bytes, stream, args.reps)
                )
            cells = []
            for mode, pairs in seen.items():
                load, plain = min(p[0] for p in pairs), min(p[1] for p in pairs)
                cells.append(f"{mode} load {load:8.1f} (copy_ {plain:8.1f}) ratio {plain / load:.2f}")
            print(f"{row_bytes // 1024}K {entry} x{batch}: " + "  ".join(cells), flush=True)
            copier.close()
            region.close()


if __name__ == "__main__":
    main()
