"""The batches `bench/copy_host_launch.py` times: BATCH entries laid out in the region as named.

Each case is (name, row width in bf16 elements, rows per entry, the entries' extents, region
blocks): runs cut by hand (`in_runs`), scattered at random, or taken from the tier's table full and
aged (`bench.copy_bandwidth.aged`). The same `random.Random` gives the same batches every pass.
"""

from __future__ import annotations

import random

from bench.copy_bandwidth import aged, scattered
from ec_connector.domain.blocks import Extent

BATCH = 32


def in_runs(rows: int, runs: int, gap: int) -> tuple[list[tuple[Extent, ...]], int]:
    """BATCH entries of `rows` rows, each cut into `runs` runs with `gap` free blocks between runs."""
    out, pos = [], 0
    for _ in range(BATCH):
        ext, left = [], rows
        for k in range(runs):
            n = left if k == runs - 1 else rows // runs
            ext.append(Extent(pos, n))
            pos += n + gap
            left -= n
        out.append(tuple(ext))
    return out, pos


def cases(rng: random.Random) -> list[tuple[str, int, int, list[tuple[Extent, ...]], int]]:
    """(name, width, rows, extents per entry, region blocks); "one output": payloads are views of one
    tensor (as an encoder's per-item outputs are), so touching runs may be joined on saves too."""
    out = []
    for name, width, rows, runs, gap in (
        ("64 rows x 7 KiB, 1 run", 3584, 64, 1, 0),
        ("64 rows x 7 KiB, 1 run, one output", 3584, 64, 1, 0),
        ("64 rows x 7 KiB, 1 run, gaps", 3584, 64, 1, 1),
        ("64 rows x 7 KiB, 3 runs", 3584, 64, 3, 1),
        ("64 rows x 2 KiB, 1 run", 1024, 64, 1, 0),
        ("1 MiB of 7 KiB rows, 2 runs", 3584, 146, 2, 5),
        ("16 MiB of 32 KiB rows, 1 run", 16384, 512, 1, 0),
    ):
        ext, blocks = in_runs(rows, runs, gap)
        out.append((name, width, rows, ext, blocks))
    for name, width, rows in (
        ("1 MiB of 2 KiB rows, runs1-16", 1024, 512),
        ("1 MiB of 7 KiB rows, runs1-16", 3584, 146),
        ("1 MiB of 2 KiB rows, aged", 1024, 512),
        ("1 MiB of 7 KiB rows, aged", 3584, 146),
        # vLLM loads at most its encoder cache's rows in one step: max(max_num_batched_tokens, the
        # model's largest item), and max_num_batched_tokens defaults to 8192 (API server) or 16384
        # (offline) on an H200; these are the largest 32-entry batches those leave
        ("1.75 MiB of 7 KiB rows, aged, 8192 rows", 3584, 256),
        ("3.5 MiB of 7 KiB rows, aged, 16384 rows", 3584, 512),
        ("8 MiB of 7 KiB rows, aged", 3584, 1170),
        ("16 MiB of 7 KiB rows, aged", 3584, 2340),
        ("8 MiB of 7 KiB rows, aged, 25% reads", 3584, 1170),
        ("16 MiB of 7 KiB rows, aged, 25% reads", 3584, 2340),
    ):
        if "aged" in name:  # the tier's table, full and aged, with its run floor and cap
            blocks = int(BATCH * rows * 2.2) + 64
            reads = 0.25 if name.endswith("reads") else 0.0  # a read queues its entry again
            ext = aged(blocks, rows, BATCH, rng, row_bytes=width * 2, read_share=reads)
        else:
            blocks = (BATCH + 8) * rows
            ext = scattered(blocks, rows, BATCH, rng)
        out.append((name, width, rows, ext, blocks))
    return out
