"""The printed lines of `bench/copy_host_launch.py`: one case's cells, and the best of several passes.

Both read the dicts `measure` returns (per call: median, p10, p90 and the thread's CPU median in
µs; the driver's own calls where the batch has no kernel runs) and print them as they come.
"""

from __future__ import annotations


def print_case(r: dict) -> None:
    def cell(label: str, t: dict) -> str:
        spread = f"{t['p10_us']:.0f}-{t['p90_us']:.0f}"
        return f"{label} {t['median_us']:7.1f} us ({spread}; cpu {t['cpu_median_us']:.0f})"

    def line(head: str, prefix: str, tail: str) -> None:
        """The launcher's save, the step thread's ("inline") and their ratio, the load, `tail`."""
        save, inline, load = r[f"{prefix}save"], r[f"{prefix}save_inline"], r[f"{prefix}load"]
        ratio = save["median_us"] / inline["median_us"]
        saves = f"{cell('save', save)}  {cell('inline', inline)} x{ratio:.2f}"
        print(f"{head}{saves}  {cell('load', load)}{tail}", flush=True)

    line(
        f"{r['case']:36s} runs {r['runs']:5d}  ",
        "",
        f"  plan {r['plan_us']:6.1f} us  bytes {'ok' if r['bytes_ok'] else 'WRONG'}"
        f"  steal {r['steal_pct']:.1f}%",
    )
    line(f"{'  through TierWorker (bind, save x32, flush / start_loads)':58s} ", "worker_", "")
    parts = [
        f"{call} less it {ours_us(r, call, driver):6.1f} us (driver {r[driver]['median_us']:.1f})"
        for call, driver in OURS
        if driver in r
    ]
    if parts:
        print(f"{'  our part (the driver call alone, same copies, in turn)':58s} " + "  ".join(parts))


# (the step thread's call, the driver call it makes for the same copies, timed in turn with it)
OURS = (
    ("save_inline", "save_driver"),
    ("load", "load_driver"),
    ("worker_save_inline", "worker_save_driver"),
    ("worker_load", "worker_load_driver"),
)


def ours_us(r: dict, call: str, driver: str) -> float:
    """Median host µs of the step thread's call less the median of the driver call it makes."""
    return float(r[call]["median_us"] - r[driver]["median_us"])


def print_best(passes: list[list[dict]]) -> None:
    """Per case and call, the lowest of the passes' medians and the highest: the host's load drifts
    over minutes on the GPU machine, and the lowest median is the code's cost at its quietest."""
    calls = ("save", "save_inline", "load", "worker_save", "worker_save_inline", "worker_load")

    def lowest_and_highest(key: str) -> None:
        for i, first in enumerate(passes[0]):
            cells = []
            for call in calls:
                medians = [rows[i][call][key] for rows in passes]
                cells.append(f"{min(medians):9.1f} ({max(medians):6.1f})")
            print(f"{first['case']:36s} {first['runs']:5d}  " + "  ".join(cells), flush=True)

    print(f"# best of {len(passes)} passes: lowest median us (highest)")
    print(f"{'case':36s} {'runs':>5s}  " + "  ".join(f"{c:>18s}" for c in calls))
    lowest_and_highest("median_us")
    print("# the step thread's own CPU time in those calls: lowest median us (highest)")
    lowest_and_highest("cpu_median_us")
    print("# our part of the step thread's call: the call less the driver's own, per pass: lowest (highest)")
    print(f"{'case':36s} {'runs':>5s}  " + "  ".join(f"{c + ' - driver':>28s}" for c, _ in OURS))
    for i, first in enumerate(passes[0]):
        cells = []
        for call, driver in OURS:
            if driver not in first:
                cells.append(f"{'(kernel runs)':>28s}")
                continue
            ours = [ours_us(rows[i], call, driver) for rows in passes]
            cells.append(f"{min(ours):19.1f} ({max(ours):6.1f})")
        print(f"{first['case']:36s} {first['runs']:5d}  " + "  ".join(cells), flush=True)
