"""Tables and a PNG from one or more serving-bench JSONs (ec-connector bench serving run).

Rounds are paired within a run (same `run_id` and round number: the arms ran back to back), so
each ratio is taken per round and the table gives its median and its spread (min-max over
rounds). Merging several runs (e.g. one command per round on the GPU) pools their rounds.
Ratios are arm / reference of the same figure: for wall time and TTFT lower is better, for
req/s and tokens/s higher is better. The ``limit`` rows are the no-connector engine with the
encoder stubbed; each ``repeat`` row also gives its wall time against that floor. The fleet
rows (``fleet-repeat``, ``fleet-pressure``) compare ``fleet`` with ``local`` and ``upstream``
(per-replica tiers) and its hit ratio with ``single``'s (one engine, the same total region).
Pressure rows also give each arm's measured hit ratio beside the one expected from a replay of
the same requests through our table (serving_expected.py, recorded in the workload's notes):
``upstream`` against ``fifo``, ``ours`` / ``single`` / ``local`` against ours' eviction (the
run's ``--ours-extra`` policy, else its default; ``local`` and the fleet's ``upstream`` with a
region per replica); ``fleet`` against the replay of the pair pulling from each other (in JSONs
without it, the range from a region per replica to one region of both regions' bytes). Also a
line of a measured pass's wall time against the items it encoded (``pass_line``), with the req/s
ratio the arms' encoded items alone give, to tell what the hit ratios are worth from what else
moved between the arms.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from statistics import median
from typing import Any

from ec_connector.benchmarks.output import pyplot

FIGURES = (
    ("wall_s", "wall s", "{:.2f}"),
    ("req_s", "req/s", "{:.2f}"),
    ("out_tok_s", "tok/s", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
    ("ttft_p99_ms", "TTFT p99 ms", "{:.0f}"),
    ("encoder_items", "enc items", "{:.0f}"),
    ("hit_ratio", "hit ratio", "{:.2f}"),
)
# Recorded where they apply (E->PD, the stub, a connector's hook time), printed under the table.
EXTRAS = (
    "e2e_ttft_p50_ms",
    "producer_p50_ms",
    "published",
    "pull_p50_ms",
    "stubbed_items",
    "hook_ms",
    "fleet_pulls",
)
ARM_ORDER = ("none", "upstream", "ours", "limit", "local", "fleet", "single")
SPEED = ("wall_s", "req_s", "out_tok_s", "ttft_p50_ms", "ttft_p99_ms")
# (arm, reference, figures) of the fleet rows, printed as arm / reference
FLEET_RATIOS = (
    ("fleet", "local", SPEED),
    ("fleet", "upstream", SPEED),
    ("local", "upstream", SPEED),
    ("fleet", "single", ("hit_ratio", "req_s")),
)

Cell = dict[tuple[str, int], float]  # (run_id, round) -> value
# arm -> (notes key, policy) of its expected hit ratio, None for ours' eviction (`ours_eviction`
# when --ours-extra set one, else `default_eviction`; "s3fifo" in runs that recorded neither: it
# was the default then); fleet mode's per-replica arms differ
EXPECTED_BY_ARM: dict[str, tuple[str, str | None]] = {
    "upstream": ("expected_hit_ratio", "fifo"),
    "ours": ("expected_hit_ratio", None),
}
FLEET_EXPECTED_BY_ARM: dict[str, tuple[str, str | None]] = {
    "upstream": ("expected_hit_ratio_per_replica", "fifo"),
    "local": ("expected_hit_ratio_per_replica", None),
    "single": ("expected_hit_ratio", None),
    "fleet": ("expected_hit_ratio_fleet", None),
}
_WHERE = {"expected_hit_ratio_per_replica": " a region per replica", "expected_hit_ratio_fleet": " pulling"}


def collect(runs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, dict[str, Cell]]]:
    """{(mode, workload key): {arm: {figure: {(run_id, round): value}}}}; limit is its own arm."""
    table: dict[tuple[str, str], dict[str, dict[str, Cell]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(dict))
    )
    for run in runs:
        for eng in run["engines"]:
            for wl in eng.get("workloads", []):
                key = wl["key"]
                arm = eng["arm"]
                if wl["workload"] == "limit":
                    key, arm = key.replace("limit@", "repeat@"), "limit"
                for fig in [f for f, _, _ in FIGURES] + list(EXTRAS):
                    value = wl["measured"].get(fig)
                    if value is not None:
                        table[(run["mode"], key)][arm][fig][(run["run_id"], eng["round"])] = value
    return table


def replica_items(runs: list[dict[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """{(mode, workload key): ["arm round r: [items per replica]", ...]} for the fleet rows."""
    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    for run in runs:
        for eng in run["engines"]:
            for wl in eng.get("workloads", []):
                per = wl["measured"].get("replica_encoder_items")
                if per is not None:
                    out[(run["mode"], wl["key"])].append(f"{eng['arm']} round {eng['round']}: {per}")
    return out


def workload_notes(runs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """{(mode, workload key): the notes the run recorded for it} (the last run's, when merged)."""
    out = {}
    for run in runs:
        for w in run.get("workloads", []):
            out[(run["mode"], f"{w['name']}@{w['size'][0]}x{w['size'][1]}")] = w.get("notes", {})
    return out


def expected_line(key: str, notes: dict[str, Any], arms: dict[str, dict[str, Cell]]) -> str | None:
    """'hit ratio measured / expected: arm m / e (policy), ...' for a workload with expected ratios."""
    exp = notes.get("expected_hit_ratio")
    if not exp:
        return None
    fleet = key.startswith("fleet-")
    table = FLEET_EXPECTED_BY_ARM if fleet else EXPECTED_BY_ARM
    default = notes.get("default_eviction", "s3fifo")
    parts = []
    for arm in [a for a in ARM_ORDER if a in arms]:
        vals = list(arms[arm].get("hit_ratio", {}).values())
        measured = f"{median(vals):.2f}" if vals else "-"
        where, named = table.get(arm, ("", ""))
        policy = named or notes.get("ours_eviction", default)  # ours' arms: --ours-extra's policy
        ratio = notes.get(where, {}).get(policy)
        if ratio is not None:
            parts.append(f"{arm} {measured} / {ratio:.2f} ({policy}{_WHERE.get(where, '')})")
        elif fleet and arm == "fleet" and policy in notes.get("expected_hit_ratio_per_replica", {}):
            # a JSON without the pair's replay (of this policy): between a region each and one region
            low = notes["expected_hit_ratio_per_replica"][policy]
            span = f"{low:.2f}-{exp[policy]:.2f}"
            parts.append(f"fleet {measured} / {span} ({policy}, a region each - one region)")
        elif arm == "none":
            parts.append(f"none {measured} (vLLM's own encoder cache)")
    return (
        "  hit ratio measured / expected from a replay in our table: "
        + ", ".join(parts)
        + f"; belady (offline) {exp['belady']:.2f}"
    )


# Arms whose measured passes share one engine layout, so one line fits their pass times; and the
# pairs whose req/s ratio the line predicts from their encoded items alone.
LINE_ARMS = {False: ("none", "upstream", "ours"), True: ("upstream", "local", "fleet")}
LINE_PAIRS = {
    False: (("ours", "upstream"), ("ours", "none"), ("upstream", "none")),
    True: (("fleet", "local"), ("fleet", "upstream"), ("local", "upstream")),
}


# ours' tier counters summed over an arm's measured passes, printed under a pressure row: where
# the requests that the replay counts as hits went in the engine
TIER_COUNTERS_SHOWN = ("hits", "misses", "misses_saving", "saves_failed", "not_offloaded", "evictions")


def measured_passes(runs: list[dict[str, Any]]) -> Iterator[tuple[tuple[str, str], str, dict[str, Any]]]:
    """((mode, workload key), arm, pass record) of every measured pass of every run."""
    for run in runs:
        for eng in run["engines"]:
            for wl in eng.get("workloads", []):
                for p in wl.get("passes", []):
                    if p.get("measured"):
                        yield (run["mode"], wl["key"]), eng["arm"], p


def counter_lines(runs: list[dict[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """{(mode, workload key): ["arm: hits n, misses n, ...", ...]} for arms whose passes recorded
    tier counters (ours' arms), summed over their measured passes and rounds."""
    sums: dict[tuple[str, str], dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))
    for key, arm, p in measured_passes(runs):
        counters = p.get("counters") or {}
        if "misses" in counters:
            total = sums[key][arm]
            for name in TIER_COUNTERS_SHOWN:
                total[name] = total.get(name, 0) + counters.get(name, 0)
    return {
        key: [f"{arm}: " + ", ".join(f"{k} {v}" for k, v in c.items()) for arm, c in arms.items()]
        for key, arms in sums.items()
    }


def cpu_lines(runs: list[dict[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """{(mode, workload key): ["arm: step thread CPU x of the wall time, n blocks a pass, ..."]} over
    the measured passes that recorded their CPU split (proc_cpu.py): the busiest main thread's CPU
    seconds against the pass's wall time (median over passes), its voluntary switches a pass and
    its process's other threads' CPU a pass."""
    found: dict[tuple[str, str], dict[str, list[tuple[float, int, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for key, arm, p in measured_passes(runs):
        top = max(p.get("cpu") or [], key=lambda c: c["main_cpu_s"], default=None)
        if top is not None and p.get("wall_s"):
            found[key][arm].append(
                (top["main_cpu_s"] / p["wall_s"], top["main_voluntary"], top["others_cpu_s"])
            )
    return {
        key: [
            f"{arm}: step thread CPU {median(v[0] for v in vals):.2f}x the wall time, "
            f"{median(v[1] for v in vals):.0f} blocks, "
            f"other threads {median(v[2] for v in vals):.2f} s a pass"
            for arm, vals in sorted(
                arms.items(), key=lambda kv: ARM_ORDER.index(kv[0]) if kv[0] in ARM_ORDER else 99
            )
        ]
        for key, arms in found.items()
    }


def pass_points(runs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, list[tuple[int, float]]]]:
    """{(mode, workload key): {arm: [(encoder items, wall s) of each measured pass]}}."""
    out: dict[tuple[str, str], dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for key, arm, p in measured_passes(runs):
        if "encoder_items" in p and "wall_s" in p:
            out[key][arm].append((p["encoder_items"], p["wall_s"]))
    return out


def pass_line(key: str, points: dict[str, list[tuple[int, float]]]) -> str | None:
    """What the arms' encoded items alone are worth: a least-squares line of a measured pass's wall
    time against the items it encoded, over the arms of one engine layout (``LINE_ARMS``), and the
    req/s ratio it gives each pair at their mean items a pass. None when the items do not vary."""
    fleet = key.startswith("fleet-")
    pts = [pt for arm in LINE_ARMS[fleet] for pt in points.get(arm, [])]
    n = len(pts)
    if n < 3:
        return None
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    base = my - slope * mx
    scatter = (sum((y - base - slope * x) ** 2 for x, y in pts) / n) ** 0.5
    mean = {arm: sum(x for x, _ in v) / len(v) for arm, v in points.items() if v}
    worth = [
        f"{arm} / {ref} {(base + slope * mean[ref]) / (base + slope * mean[arm]):.2f}x"
        for arm, ref in LINE_PAIRS[fleet]
        if arm in mean and ref in mean
    ]
    fitted = ", ".join(a for a in LINE_ARMS[fleet] if a in points)
    return (
        f"  pass time by encoded items ({n} measured passes of {fitted}): {base:.3f} s + "
        f"{slope * 1000:.1f} ms an item (scatter {scatter:.3f} s); req/s the items alone give: "
        + ", ".join(worth)
    )


def ratio_spread(num: Cell, den: Cell) -> tuple[float, float, float, int] | None:
    """Median, min, max of num/den over the rounds both have; None when none is shared."""
    ratios = [num[k] / den[k] for k in num if k in den and den[k]]
    if not ratios:
        return None
    return median(ratios), min(ratios), max(ratios), len(ratios)


def fmt_ratio(r: tuple[float, float, float, int] | None) -> str:
    if r is None:
        return "-"
    mid, lo, hi, _ = r
    return f"{mid:.2f}x ({lo:.2f}-{hi:.2f})"


def skipped_arms(runs: list[dict[str, Any]]) -> dict[str, str]:
    out = {}
    for run in runs:
        for eng in run["engines"]:
            if eng["status"] == "skipped":
                out[eng["arm"]] = eng.get("reason", "skipped")
            elif not eng["status"].startswith("ok"):
                out.setdefault(f"{eng['arm']} (round {eng['round']})", eng["status"])
            if eng.get("leftover_shm"):
                out[f"{eng['arm']} (round {eng['round']}) left region files"] = ", ".join(eng["leftover_shm"])
    return out


def print_report(runs: list[dict[str, Any]]) -> None:
    table = collect(runs)
    per_replica = replica_items(runs)
    notes = workload_notes(runs)
    points = pass_points(runs)
    counters = counter_lines(runs)
    cpu = cpu_lines(runs)
    for (mode, key), arms in sorted(table.items()):
        rounds = max((len(c) for a in arms.values() for c in a.values()), default=0)
        print(f"\n== {key}, {mode} ({rounds} round(s); median of rounds, ratio median (min-max)) ==")
        head = f"{'arm':<9}" + "".join(f"{label:>14}" for _, label, _ in FIGURES)
        print(head)
        for arm in [a for a in ARM_ORDER if a in arms]:
            cells = []
            for fig, _, form in FIGURES:
                vals = list(arms[arm].get(fig, {}).values())
                cells.append(f"{form.format(median(vals)) if vals else '-':>14}")
            print(f"{arm:<9}" + "".join(cells))
        for arm in [a for a in ARM_ORDER if a in arms]:
            extras = [
                f"{fig} {median(arms[arm][fig].values()):.0f}"
                for fig in EXTRAS
                if arms[arm].get(fig) and (fig != "stubbed_items" or arm == "limit")
            ]
            if extras:
                print(f"  {arm}: " + ", ".join(extras))
        for ref in ("upstream", "none", "limit"):
            if ref not in arms:
                continue
            figs: tuple[str, ...] = ("wall_s",) if ref == "limit" else SPEED
            for arm in [a for a in ("ours", "upstream", "none") if a in arms and a != ref]:
                print_ratios(arms, arm, ref, figs)
        for arm, ref, pair_figs in FLEET_RATIOS:
            if arm in arms and ref in arms:
                print_ratios(arms, arm, ref, pair_figs)
        line = expected_line(key, notes.get((mode, key), {}), arms)
        if line:
            print(line)
            worth = pass_line(key, points.get((mode, key), {}))
            if worth:
                print(worth)
            if counters.get((mode, key)):
                print("  tier counters over the measured passes: " + "; ".join(counters[(mode, key)]))
        if per_replica.get((mode, key)):
            print("  encoder items per replica: " + "; ".join(per_replica[(mode, key)]))
        if cpu.get((mode, key)):
            print("  CPU a measured pass (median): " + "; ".join(cpu[(mode, key)]))
    for arm, why in skipped_arms(runs).items():
        print(f"\n{arm}: {why}")


def print_ratios(arms: dict[str, dict[str, Cell]], arm: str, ref: str, figs: tuple[str, ...]) -> None:
    parts = [
        f"{fig} {fmt_ratio(ratio_spread(arms[arm].get(fig, {}), arms[ref].get(fig, {})))}" for fig in figs
    ]
    print(f"  {arm} / {ref}: " + ", ".join(parts))


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    """Req/s and TTFT p50 per workload and arm (bars: median of rounds; whiskers: min-max)."""
    plt = pyplot()

    table = collect(runs)
    keys = sorted(table)
    arms = [a for a in ARM_ORDER if any(a in table[k] for k in keys)]
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(keys)), 4.5))
    width = 0.8 / max(1, len(arms))
    for ax, (figname, label) in zip(
        axes, (("req_s", "req/s (higher is better)"), ("ttft_p50_ms", "TTFT p50 ms")), strict=True
    ):
        for j, arm in enumerate(arms):
            xs, mids, lows, highs = [], [], [], []
            for i, k in enumerate(keys):
                vals = list(table[k].get(arm, {}).get(figname, {}).values())
                if not vals:
                    continue
                xs.append(i + (j - (len(arms) - 1) / 2) * width)
                m = median(vals)
                mids.append(m)
                lows.append(m - min(vals))
                highs.append(max(vals) - m)
            ax.bar(xs, mids, width, yerr=[lows, highs], capsize=3, label=arm)
        ax.set_xticks(range(len(keys)), ["\n".join([*k[1].split("@"), k[0]]) for k in keys], fontsize=7)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("serving bench: no connector, vLLM ECCPUConnector, ours (limit: encoder stubbed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
