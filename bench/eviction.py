"""Eviction policies against each other: miss ratio against region size, per trace.

Every trace of bench/cache_traces.py (`SOURCES`, then the engine-shaped `ENGINE_SOURCES`: one
request a step, one 768-row image each, the serving bench's own Zipf sampler) is replayed
through our EntryTable (the shipped run floor and cap) with each policy, at regions of 5-50% of
the trace's footprint (the blocks of its distinct items), and through vLLM's EmbeddingCache where
vLLM imports (`.venv-vllm`):

    .venv/bin/python bench/eviction.py --json out/eviction.json --plot docs/img/eviction_miss_ratio.png
    .venv-vllm/bin/python bench/eviction.py --quick     # with vLLM's EmbeddingCache; ~1 min

Policies: `fifo`, `s3fifo` and `lecar` as shipped (domain/eviction.py, domain/eviction_lecar.py:
`lecar` is LRU and `lfu` as two experts, each eviction following the one whose past evictions
were wanted again least, weights learnt from the policy's own misses), and the candidates tried
beside them (bench/eviction_candidates.py): `clock` (CLOCK / SIEVE-like), `s3fifo-paper`
(S3-FIFO with the paper's ghost of a whole region and a read count capped at 3), `s3fifo-tinylfu`
(S3-FIFO with a TinyLFU admission filter), `lfu` and `lfu-fast-aging` (least frequently used with
a ghost of counts, halved every 10x / 1x the tracked keys' accesses; domain/eviction_lecar.py),
`wtinylfu` (bench/eviction_wtinylfu.py: W-TinyLFU with Caffeine's hill-climbing window) and
`arc` (bench/eviction_arc.py: ARC counted in blocks), `lfu-block` and `duel-block`
(bench/eviction_block.py: `lfu` and `duel` ranking by count per block, a heap), `lfu-bucket[:k=K]` and
`duel-bucket[:k=K]` (bench/eviction_block_buckets.py: the same order in O(1) queues of a quantised
count per block), `hyperbolic[:...]` and
`lecar-tuned[:...]`
(bench/eviction_hyperbolic.py: hyperbolic caching over a random sample; `lecar` with other
settings), `decayed[:...]`, `decayed-adaptive[:...]` and `decayed-climb[:...]`
(bench/eviction_decayed.py: exponentially decayed counts, with one half-life, following shadow
regions of several, or climbing among several by the hit ratio);
`s3fifo:small=S,ghost=G,reads=R` replays S3-FIFO with other queue shares and read cap (any subset
of the three).
Offline references:
`belady` (farthest next request first, in our table; ec_connector/benchmarks/replay.py) and
`bound` (a lower bound on every policy's miss ratio; bench/eviction_offline.py), and
`popularity` (the item of least request rate per block in the current popularity regime first,
from the trace generator's own rankings: what knowing the items' rates, not the order, gives;
bench/eviction_offline.py), and `posterior` (online, knowing the trace's law, not its ranking:
the item of least posterior mean request rate per block first, learnt from every request seen
since the last re-ranking; `posterior-bytes` the same per entry, for byte hits; both in
bench/eviction_offline.py). The driver
(replay.py's `replay_hits`) is compare_cache's step loop without the per-step lookups of live
items (they change no state): per step, saves become ready (1% fail) and
loads unpin, then each arriving item is looked up: ready -> a hit (pinned for a step), absent ->
a miss (reserved, may evict), not ready -> waits. Miss ratio = misses / (hits + misses); byte miss
ratio the same in blocks. The targets (issue 30): miss ratio <= 0.85x fifo's at 10-25% of the
working set, never above fifo's by more than 1 point.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cache_sides import BaselineSide, OursSide  # noqa: E402
from bench.cache_traces import ENGINE_SOURCES, SOURCES, TRACES, Trace, make_trace  # noqa: E402
from bench.eviction_arc import ArcPolicy  # noqa: E402
from bench.eviction_block import BlockDuelPolicy, BlockLfuPolicy  # noqa: E402
from bench.eviction_block_buckets import is_bucket, make_bucket  # noqa: E402
from bench.eviction_candidates import ClockPolicy, Settings, TinyLfuS3FifoPolicy, policy_settings  # noqa: E402
from bench.eviction_hyperbolic import is_candidate, make_candidate  # noqa: E402
from bench.eviction_offline import (  # noqa: E402
    PopularityPolicy,
    PosteriorPolicy,
    TraceLaw,
    law_of,
    miss_ratio_bound,
    popularity_of,
)
from bench.eviction_wtinylfu import WTinyLfuPolicy  # noqa: E402
from bench.vllm_baseline import BaselineUnavailable, load  # noqa: E402
from ec_connector.benchmarks.output import pyplot, write_json  # noqa: E402
from ec_connector.benchmarks.replay import (  # noqa: E402
    BeladyPolicy,
    RequestClock,
    replay_hits,
    request_positions,
)
from ec_connector.domain import eviction  # noqa: E402
from ec_connector.domain.eviction_duel import DuelPolicy  # noqa: E402
from ec_connector.domain.eviction_lecar import LeCarPolicy, LfuPolicy  # noqa: E402

CANDIDATES = (
    "fifo",
    "s3fifo",
    "clock",
    "s3fifo-paper",
    "s3fifo-tinylfu",
    "lfu",
    "lfu-fast-aging",
    "lecar",
    "duel",
    "wtinylfu",
    "arc",
)
WTINYLFU_VARIANTS: dict[str, dict[str, Any]] = {"wtinylfu": {}}
FRACTIONS = (0.05, 0.10, 0.15, 0.25, 0.50)
TARGET_FRACTIONS = (0.10, 0.15, 0.25)
TARGET_RATIO = 0.85
_EC = "vllm.distributed.ec_transfer.ec_connector.cpu"


# `s3fifo:` followed by comma-separated settings replays S3-FIFO with other shares, e.g.
# `s3fifo:small=0.05,ghost=0.4,reads=7` (the shipped ones: eviction.SMALL_SHARE, GHOST_SHARE, MAX_READS)
S3FIFO_SETTINGS: Settings = {
    "small": ("small_share", float),
    "ghost": ("ghost_share", float),
    "reads": ("max_reads", int),
}


# `duel:window=W,z=Z,run=R` replays `duel` with other settings (the shipped ones: eviction_duel.WINDOW, Z,
# BURST_RUN; `run=1000000000`: no burst is ever told)
DUEL_SETTINGS: Settings = {"window": ("window", float), "z": ("z", float), "run": ("burst_run", int)}


def _ours(policy: str) -> Callable[[int], OursSide]:
    """A side with our table and `policy`: a shipped one by name, or a candidate of this bench."""
    settings = policy_settings(policy, S3FIFO_SETTINGS) if policy.startswith("s3fifo:") else None
    duel = policy_settings(policy, DUEL_SETTINGS) if policy.startswith("duel:") else None

    def make(num_blocks: int) -> OursSide:
        side = OursSide(num_blocks)
        table = side.table
        evictable = table._evictable  # the bench swaps the policy in before the first entry
        if settings is not None:
            table._policy = eviction.S3FifoPolicy(num_blocks, evictable, min_compact=64, **settings)
        elif duel is not None:
            table._policy = DuelPolicy(num_blocks, evictable, **duel)
        elif policy == "clock":
            table._policy = ClockPolicy(evictable)
        elif policy == "s3fifo-paper":
            table._policy = eviction.S3FifoPolicy(
                num_blocks, evictable, min_compact=64, ghost_share=0.9, max_reads=3
            )
        elif policy == "s3fifo-tinylfu":
            table._policy = TinyLfuS3FifoPolicy(num_blocks, evictable, min_compact=64)
        elif policy == "lfu":
            table._policy = LfuPolicy(num_blocks, evictable)
        elif policy == "lfu-block":
            table._policy = BlockLfuPolicy(num_blocks, evictable)
        elif policy == "duel-block":
            table._policy = BlockDuelPolicy(num_blocks, evictable)
        elif is_bucket(policy):
            table._policy = make_bucket(policy, num_blocks, evictable)
        elif policy == "lfu-fast-aging":
            table._policy = LfuPolicy(num_blocks, evictable, age=1.0)
        elif policy == "lecar":
            table._policy = LeCarPolicy(num_blocks, evictable)
        elif policy == "arc":
            table._policy = ArcPolicy(num_blocks, evictable)
        elif policy in WTINYLFU_VARIANTS:
            table._policy = WTinyLfuPolicy(num_blocks, evictable, **WTINYLFU_VARIANTS[policy])
        elif is_candidate(policy):
            table._policy = make_candidate(policy, num_blocks, evictable)
        else:
            table._policy = eviction.make_policy(
                policy, num_blocks=num_blocks, evictable=evictable, min_compact=64
            )
        return side

    return make


def _popularity(num_blocks: int, trace: Trace, clock: RequestClock) -> OursSide:
    side = OursSide(num_blocks)
    regimes, weights = popularity_of(trace)
    side.table._policy = PopularityPolicy(side.table._evictable, regimes, weights, clock)
    return side


def _posterior(num_blocks: int, law: TraceLaw, clock: RequestClock, *, per_block: bool = True) -> OursSide:
    side = OursSide(num_blocks)
    side.table._policy = PosteriorPolicy(side.table._evictable, law, clock, per_block=per_block)
    return side


def _belady(num_blocks: int, positions: dict[str, list[int]], clock: RequestClock) -> OursSide:
    side = OursSide(num_blocks)
    side.table._policy = BeladyPolicy(side.table._evictable, positions, clock)
    return side


def run(
    *,
    quick: bool = False,
    traces: tuple[str, ...] = SOURCES + ENGINE_SOURCES,
    policies: tuple[str, ...] = CANDIDATES,
    offline: bool = True,
    steps: int | None = None,
    seed: int = 8,
    progress: Callable[[str], None] | None = None,
) -> dict:
    say = progress or (lambda _m: None)
    steps = steps or (1000 if quick else 4000)
    makers: dict[str, Callable[[int], Any]] = {p: _ours(p) for p in policies}
    try:
        cache_cls = load(f"{_EC}.scheduler.embedding_cache").EmbeddingCache
        makers["vllm"] = lambda n: BaselineSide(n, cache_cls)
    except BaselineUnavailable as err:
        say(f"vLLM's EmbeddingCache left out: {err}")
    out: dict[str, Any] = {"bench": "eviction", "params": {"steps": steps, "seed": seed}, "traces": {}}
    for name in traces:
        probe = make_trace(steps=steps, live=256, num_blocks=0, seed=seed, source=name)
        footprint = probe.footprint_rows()
        distinct = len({item.key for item in probe.items()})
        total = len(probe.items())
        positions = request_positions(probe)
        law = law_of(probe) if offline else None  # what `posterior` knows (none for scan, compare)
        sized = len({item.rows for item in probe.items()}) > 1
        rows: dict[str, Any] = {
            "footprint_blocks": footprint,
            "items": total,
            "compulsory_miss_ratio": distinct / total,
            "by_fraction": {},
        }
        for frac in FRACTIONS:
            num_blocks = max(1, int(footprint * frac))
            trace = Trace(probe.steps, probe.live, num_blocks, name, probe.rankings)
            cell = {p: replay_hits(make(num_blocks), trace) for p, make in makers.items()}
            if offline:
                clock = RequestClock()
                cell["belady"] = replay_hits(_belady(num_blocks, positions, clock), trace, clock)
                if trace.rankings:  # the generator's popularity (none for `compare`)
                    clock = RequestClock()
                    cell["popularity"] = replay_hits(_popularity(num_blocks, trace, clock), trace, clock)
                if law is not None:
                    clock = RequestClock()
                    cell["posterior"] = replay_hits(_posterior(num_blocks, law, clock), trace, clock)
                if law is not None and sized:  # per entry: the same order when all sizes are equal
                    clock = RequestClock()
                    side = _posterior(num_blocks, law, clock, per_block=False)
                    cell["posterior-bytes"] = replay_hits(side, trace, clock)
                cell["bound"] = miss_ratio_bound(trace, num_blocks)
            rows["by_fraction"][f"{frac:.2f}"] = cell
            say(f"{name} {frac:.2f}: " + " ".join(f"{p}={c['miss_ratio']:.3f}" for p, c in cell.items()))
        out["traces"][name] = rows
    out["targets"] = _targets(out)
    return out


def _targets(res: dict) -> dict:
    """Per trace, each policy against fifo: the worst miss-ratio ratio at 10-25% of the footprint
    (target <= 0.85) and the largest excess over fifo anywhere (target <= 1 point); and the offline
    bound against fifo at each of those regions (above 0.85: the target is infeasible there)."""
    out = {}
    for name, rows in res["traces"].items():
        cells = rows["by_fraction"]
        targets = [cells[f"{f:.2f}"] for f in TARGET_FRACTIONS]
        per: dict[str, Any] = {}
        for policy in next(iter(cells.values())):
            if policy == "fifo":
                continue
            ratio = max(c[policy]["miss_ratio"] / max(1e-9, c["fifo"]["miss_ratio"]) for c in targets)
            excess = max(c[policy]["miss_ratio"] - c["fifo"]["miss_ratio"] for c in cells.values())
            per[policy] = {
                "worst_ratio_10_25": ratio,
                "ratio_met": ratio <= TARGET_RATIO,
                "max_excess_points": 100 * excess,
                "excess_met": excess <= 0.01,
            }
        if "bound" in per:
            per["bound"]["by_fraction"] = {
                f"{f:.2f}": c["bound"]["miss_ratio"] / max(1e-9, c["fifo"]["miss_ratio"])
                for f, c in zip(TARGET_FRACTIONS, targets, strict=True)
            }
            per["bound"]["feasible_everywhere"] = per["bound"]["worst_ratio_10_25"] <= TARGET_RATIO
        out[name] = per
    return out


def render(res: dict, shown: str = "s3fifo") -> str:
    lines = []
    for name, rows in res["traces"].items():
        cells = rows["by_fraction"]
        policies = list(next(iter(cells.values())))
        lines.append(
            f"{name}: {rows['items']} items, footprint {rows['footprint_blocks']} blocks, "
            f"compulsory miss ratio {rows['compulsory_miss_ratio']:.3f}"
        )
        lines.append(f"  {'region':<8}" + "".join(f"{p:>16}" for p in policies) + f"{shown + '/fifo':>14}")
        for frac, cell in cells.items():
            ratio = (
                cell[shown]["miss_ratio"] / max(1e-9, cell["fifo"]["miss_ratio"]) if shown in cell else 0.0
            )
            lines.append(f"  {frac:<8}" + "".join(_cell(cell[p]) for p in policies) + f"{ratio:>14.3f}")
        for policy, t in res["targets"][name].items():
            lines.append(
                f"  {policy + '/fifo':<20} worst at 10-25% {t['worst_ratio_10_25']:.3f} "
                f"({'met' if t['ratio_met'] else 'NOT met'}), most above fifo "
                f"{t['max_excess_points']:+.2f} points"
            )
    lines.append("cells: miss ratio / byte miss ratio; bound: the lowest miss ratio any policy can reach")
    return "\n".join(lines)


def _cell(c: dict) -> str:
    byte = f"{c['byte_miss_ratio']:.2f}" if "byte_miss_ratio" in c else "   -"
    return f"{c['miss_ratio']:>11.3f}/{byte}"


OFFLINE_STYLES = {
    "belady": "--",
    "popularity": "-.",
    "posterior": (0, (5, 1, 1, 1)),
    "posterior-bytes": (0, (1, 1)),
    "bound": ":",
}


def plot(res: dict, path: str) -> None:
    plt = pyplot()

    traces = list(res["traces"])
    cols = 3
    nrows = (len(traces) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(14, 3.6 * nrows + 0.6), squeeze=False)
    for ax, name in zip(axes.flat, traces, strict=False):
        rows = res["traces"][name]
        fracs = [float(f) for f in rows["by_fraction"]]
        policies = list(next(iter(rows["by_fraction"].values())))
        online = [p for p in policies if p not in OFFLINE_STYLES]
        # one colour per online policy (black for the offline ones): the default cycle repeats
        # past ten lines, which gave belady fifo's colour
        cmap = plt.get_cmap("tab10" if len(online) <= 10 else "tab20")
        colours = {p: cmap(k % cmap.N) for k, p in enumerate(online)}
        for policy in policies:
            ys = [cell[policy]["miss_ratio"] for cell in rows["by_fraction"].values()]
            style = OFFLINE_STYLES.get(policy, "-")
            colour = "black" if policy in OFFLINE_STYLES else colours[policy]
            ax.plot([100 * f for f in fracs], ys, marker="o", ls=style, color=colour, label=policy)
        ax.axhline(rows["compulsory_miss_ratio"], color="grey", ls=":", lw=1, label="compulsory")
        ax.axvspan(10, 25, color="tab:green", alpha=0.07)
        ax.set_title(name)
        ax.set_xlabel("region, % of the trace's footprint")
        ax.set_ylabel("miss ratio")
        ax.grid(alpha=0.3)
    spare = list(axes.flat)[len(traces) :]
    for ax in spare:
        ax.axis("off")
    seen: dict[str, Any] = {}  # every axis's lines, once each (`compare` has no `popularity`)
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    handles, labels = list(seen.values()), list(seen)
    where = spare[0] if spare else axes.flat[0]
    where.legend(handles, labels, loc="center" if spare else "best", fontsize=9)
    fig.suptitle(
        "Miss ratio against region size per eviction policy (our EntryTable; vllm: EmbeddingCache)\n"
        "belady: offline; popularity: knows the rates, not the order; posterior: knows the law, learns "
        "the rates; bound: no policy goes below"
    )
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1000 steps a trace (default 4000)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--traces", nargs="+", choices=TRACES, default=list(SOURCES + ENGINE_SOURCES))
    ap.add_argument("--policies", nargs="+", default=None, help="online policies to replay")
    ap.add_argument(
        "--no-offline", action="store_true", help="leave out belady, popularity, posterior and the bound"
    )
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--plot", metavar="PATH", help="PNG (needs matplotlib)")
    args = ap.parse_args(argv)
    res = run(
        quick=args.quick,
        traces=tuple(args.traces),
        **({"policies": tuple(args.policies)} if args.policies else {}),
        offline=not args.no_offline,
        steps=args.steps,
        seed=args.seed,
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
