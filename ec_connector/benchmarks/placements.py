"""Where a batch of entries sits in the region, for the copy benches: contiguous, after allocator
churn, in the tier's own aged table, or in random runs of 1-16 blocks. Each function returns one
tuple of extents per entry; `rng` makes the placement reproducible."""

from __future__ import annotations

import random

from ec_connector.benchmarks.aging import AgedTable
from ec_connector.domain.blocks import Extent, ExtentAllocator
from ec_connector.domain.config import MAX_ENTRY_RUNS, MIN_RUN_BYTES
from ec_connector.domain.layout import Layout

MiB = 1 << 20


def entry_rows(entry: str, row_bytes: int) -> int:
    return 64 if entry == "64rows" else max(1, int(entry.removesuffix("MiB")) * MiB // row_bytes)


def contiguous(num_blocks: int, rows: int, count: int, rng: random.Random) -> list[tuple[Extent, ...]]:
    return [(Extent(i * rows, rows),) for i in range(count)]


def churn(num_blocks: int, rows: int, count: int, rng: random.Random) -> list[tuple[Extent, ...]]:
    """Fill the region with random-sized entries, free random ones until the batch fits, allocate it."""
    alloc = ExtentAllocator(num_blocks)
    live = []
    while True:
        got = alloc.allocate(rng.randint(max(1, rows // 4), 2 * rows))
        if got is None:
            break
        live.append(got)
    rng.shuffle(live)
    for _ in range(2):  # two rounds of churn mix the free space
        while alloc.free_blocks < rows * count * 1.2 and live:
            alloc.release(live.pop())
        for _ in range(len(live) // 4):
            got = alloc.allocate(rng.randint(max(1, rows // 4), 2 * rows))
            if got is not None:
                live.insert(rng.randrange(len(live) + 1), got)
    while alloc.free_blocks < rows * count:
        alloc.release(live.pop())
    out = []
    for _ in range(count):
        got = alloc.allocate(rows)
        assert got is not None
        out.append(got)
    return out


def scattered(num_blocks: int, rows: int, count: int, rng: random.Random) -> list[tuple[Extent, ...]]:
    """Cut the region into runs of 1-16 blocks, shuffle them, deal them out to the entries."""
    chunks, pos = [], 0
    while pos < num_blocks:
        n = min(rng.randint(1, 16), num_blocks - pos)
        chunks.append((pos, n))
        pos += n
    rng.shuffle(chunks)
    it = iter(chunks)
    out = []
    for _ in range(count):
        need, ext = rows, []
        while need:
            s, n = next(it)
            n = min(n, need)
            ext.append(Extent(s, n))
            need -= n
        out.append(tuple(ext))
    return out


def aged(
    num_blocks: int, rows: int, count: int, rng: random.Random, *, row_bytes: int, read_share: float = 0.0
) -> list[tuple[Extent, ...]]:
    """The tier's own table, full, aged by FIFO eviction with 5% of entries dropped out of order
    (`aging.py`) and `read_share` of reservations after a load of a live entry (which queues it
    again for eviction), then the batch reserved through it with the product's run floor and cap."""
    layout = Layout(hidden_dim=row_bytes // 2, dtype="bfloat16", num_blocks=num_blocks)
    floor = layout.blocks_for(MIN_RUN_BYTES)
    table = AgedTable(num_blocks, floor, 0.05, rng, max_runs=MAX_ENTRY_RUNS, read_share=read_share)
    table.age(20 * num_blocks // rows, sizes=lambda r: r.randint(max(1, rows // 4), 2 * rows))
    table.drop_share = table.read_share = 0.0  # the batch's own entries must all stay, in place
    batch = [table.put(rows) for _ in range(count)]
    blocks = [b for extents in batch for e in extents for b in range(e.start, e.end)]
    assert len(blocks) == len(set(blocks)) == rows * count, "the aged batch's entries overlap"
    return batch
