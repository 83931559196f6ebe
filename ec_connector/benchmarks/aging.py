"""What a full tier's allocation does to entries over time: the run floor (`ec_min_run_bytes`) and the run
cap (`ec_max_entry_runs`) against neither.

A tier in service is full: every new entry evicts the oldest ones (FIFO). When every free is in
FIFO order, the freed space lies together and new entries stay in one or two runs. Frees out of
order (an entry dropped because its save failed or a peer read went wrong, a quarantine that
ends, an entry pinned while older ones around it go) leave slivers; a table that evicts exactly
what it needs then hands each new entry every sliver there is, and short runs copy slowly (on the
H200, runs under 256 KiB go through a gather kernel at ~0.8-0.9x the copy engines' rate, and
each run costs host time to plan and launch).

This drives the real `EntryTable` through `--ops` reservations of image-sized entries (64 to
~5,800 rows, log-uniform), at full occupancy, with a share of entries dropped out of order, once
without a floor (the baseline), once with the default floor and once with the floor and the
default run cap (the product's settings), and prints side by side: runs per
entry (mean, p99, max) of the entries of 1 MiB or more, the share of their bytes in runs shorter
than the floor (apart from an entry's one short remainder: `--strict` counts it too), the mean
occupancy after a reservation (what the floor costs in capacity), and the share of evictions made
for runs rather than space (`vllm:ec_tier_evictions_for_runs`). Evictions per reservation are the
same either way (one entry out for each one in, less the drops), so the floor's whole cost is the
occupancy: it evicts a little earlier, not more. Last, the host time of `EntryTable.reserve` (median
and p99, what the scheduler's step thread pays per new entry), floor against none.

    python -m ec_connector.benchmarks.aging   # rows of 2, 7 and 32 KiB; 0, 5 and 20% out of order
    python -m ec_connector.benchmarks.aging --quick
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from ec_connector.domain.blocks import Extent
from ec_connector.domain.cache import EntryTable
from ec_connector.domain.config import MAX_ENTRY_RUNS, MIN_RUN_BYTES
from ec_connector.domain.layout import Layout

MiB = 1 << 20
LEASE = 1e9  # saves never lapse here


def image_rows(rng: random.Random) -> int:
    """Rows of one image's encoder output: 64 to ~5,800, log-uniform (small and large images alike)."""
    return int(2 ** rng.uniform(6, 12.5))


class AgedTable:
    """An `EntryTable` kept full by FIFO eviction, with a share of entries dropped out of order."""

    def __init__(
        self,
        num_blocks: int,
        min_run: int,
        drop_share: float,
        rng: random.Random,
        *,
        max_runs: int = 0,
        read_share: float = 0.0,
    ) -> None:
        self.table = EntryTable(num_blocks, min_run=min_run, max_runs=max_runs)
        self.drop_share = drop_share
        self.read_share = read_share
        self.rng = rng
        self._keys = 0
        self.evicted = 0
        self.for_runs = 0
        self.reserve_s: list[float] = []  # host time of each `reserve` (what the step thread pays)

    def put(self, rows: int) -> tuple[Extent, ...]:
        """Reserve and complete one entry of `rows` (evicting as the tier would); its extents."""
        table, rng = self.table, self.rng
        if self.drop_share and len(table) > 1 and rng.random() < self.drop_share:
            victim = rng.choice(table.entries()[1:])  # not the oldest: that one FIFO takes anyway
            table.drop(victim.key)
        if self.read_share and len(table) > 1 and rng.random() < self.read_share:
            hit = rng.choice(table.entries()).key  # a load of a live entry: queued again for eviction
            table.pin(hit)
            table.unpin(hit)
        self._keys += 1
        key = f"e{self._keys}"
        t0 = time.perf_counter()
        res = table.reserve(key, rows, now=0.0, lease_s=LEASE)
        self.reserve_s.append(time.perf_counter() - t0)
        if res is None:
            raise RuntimeError(f"{rows} rows do not fit a table of {table.blocks.num_blocks} blocks")
        table.mark_ready(key)
        self.evicted += len(res.evicted)
        self.for_runs += res.for_runs
        return res.entry.extents

    def age(self, ops: int, sizes: Callable[[random.Random], int] = image_rows) -> None:
        """Make `ops` reservations of `sizes(rng)` rows each."""
        for _ in range(ops):
            self.put(sizes(self.rng))


@dataclass
class Aging:
    runs: list[int]
    short_share: list[float]
    occupancy: list[float]
    evictions_per_put: float
    for_runs_per_put: float
    reserve_s: list[float]

    def row(self) -> tuple[float, ...]:
        runs = sorted(self.runs)
        return (
            statistics.mean(runs),
            float(runs[int(0.99 * (len(runs) - 1))]),
            float(runs[-1]),
            statistics.mean(self.short_share),
            statistics.mean(self.occupancy),
            self.for_runs_per_put / self.evictions_per_put,
            statistics.median(self.reserve_s) * 1e6,
            sorted(self.reserve_s)[int(0.99 * (len(self.reserve_s) - 1))] * 1e6,
        )


def measure(
    row_bytes: int,
    region_bytes: int,
    floor_bytes: int,
    drop_share: float,
    ops: int,
    strict: bool,
    max_runs: int = 0,
    read_share: float = 0.0,
) -> Aging:
    """Age a table for `ops` reservations, then record the second `ops`."""
    num_blocks = region_bytes // row_bytes
    layout = Layout(hidden_dim=row_bytes // 2, dtype="bfloat16", num_blocks=num_blocks)
    min_run = layout.blocks_for(floor_bytes)
    short = layout.blocks_for(MIN_RUN_BYTES)  # what counts as short is the default floor's length
    aged = AgedTable(
        num_blocks, min_run, drop_share, random.Random(row_bytes), max_runs=max_runs, read_share=read_share
    )
    aged.age(ops)
    aged.evicted = aged.for_runs = 0
    aged.reserve_s = []
    runs, shares, occupancy = [], [], []
    for _ in range(ops):
        rows = image_rows(aged.rng)
        extents = aged.put(rows)
        occupancy.append(aged.table.blocks.used_blocks / num_blocks)
        if rows * row_bytes < MiB:
            continue
        runs.append(len(extents))
        lengths = sorted(e.length for e in extents)
        if not strict and len(lengths) > 1 and lengths[0] < short:
            lengths = lengths[1:]  # the remainder piece: one short run an entry may have
        shares.append(sum(n for n in lengths if n < short and len(extents) > 1) / rows)
    return Aging(runs, shares, occupancy, aged.evicted / ops, aged.for_runs / ops, aged.reserve_s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="7 KiB rows, 5%% out of order, fewer operations")
    parser.add_argument(
        "--ops", type=int, default=None, help="reservations to age with, then to record (20000)"
    )
    parser.add_argument("--region-mib", type=int, default=2048)
    parser.add_argument(
        "--floor-bytes", type=int, default=MIN_RUN_BYTES, help="the floor measured against none"
    )
    parser.add_argument(
        "--max-runs", type=int, default=MAX_ENTRY_RUNS, help="the run cap measured with the floor"
    )
    parser.add_argument("--strict", action="store_true", help="count an entry's short remainder as well")
    parser.add_argument(
        "--read-share",
        type=float,
        default=0.0,
        help="share of reservations that follow a load of a random live entry (a hit, which queues that "
        "entry again for eviction: more frees out of reservation order)",
    )
    args = parser.parse_args(argv)
    widths = (3584,) if args.quick else (1024, 3584, 16384)
    shares = (0.05,) if args.quick else (0.0, 0.05, 0.20)
    ops = args.ops or (4000 if args.quick else 20000)
    print(
        f"# region {args.region_mib} MiB, {ops} reservations aged then {ops} recorded; "
        f"entries 64-5,800 rows; floor {args.floor_bytes // 1024} KiB, then with a cap of "
        f"{args.max_runs} runs, against neither; "
        f"short = under {MIN_RUN_BYTES // 1024} KiB; {args.read_share:.0%} of reservations after a load"
    )
    print(
        f"{'row':>4} {'drops':>5} {'floor':>6} | {'runs/e':>6} {'p99':>4} {'max':>4} | {'short bytes':>11} | "
        f"{'occupancy':>9} | {'for runs':>8} | {'reserve us p50':>14} {'p99':>5} | "
        f"{'runs/e ratio':>12} {'occupancy ratio':>15} {'reserve p50 ratio':>17}"
    )
    region, reads = args.region_mib * MiB, args.read_share
    floor_bytes, strict = args.floor_bytes, args.strict
    for width in widths:
        row_bytes = width * 2
        for share in shares:
            base = measure(row_bytes, region, 0, share, ops, strict, read_share=reads).row()
            floor = measure(row_bytes, region, floor_bytes, share, ops, strict, read_share=reads).row()
            capped = measure(
                row_bytes, region, floor_bytes, share, ops, strict, args.max_runs, read_share=reads
            ).row()
            settings = (
                ("none", base),
                (f"{args.floor_bytes // 1024}K", floor),
                (f"+cap{args.max_runs}", capped),
            )
            for name, r in settings:
                ratios = f"{r[0] / base[0]:12.2f} {r[4] / base[4]:15.4f} {r[6] / base[6]:17.2f}"
                print(
                    f"{row_bytes // 1024:>3}K {share:>5.0%} {name:>6} | "
                    f"{r[0]:6.2f} {r[1]:4.0f} {r[2]:4.0f} | {r[3]:11.2%} | {r[4]:9.4f} | {r[5]:8.1%} | "
                    f"{r[6]:14.1f} {r[7]:5.0f} | {ratios}"
                )


if __name__ == "__main__":
    main()
