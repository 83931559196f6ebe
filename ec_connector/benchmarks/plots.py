"""PNG plots of the benchmarks' JSON figures (throughput against entry size, ours beside the baseline).

Used by `ec-connector bench`; needs matplotlib (requirements/dev.txt pins it).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from statistics import median
from typing import Any

from ec_connector.benchmarks.output import pyplot

ENTRY_ORDER = ("64rows", "1MiB", "8MiB", "16MiB")


def copy(result: dict[str, Any], path: Path) -> None:
    """Save and load GB/s per entry size (median over row widths), beside the same-run memcpy."""
    plt = pyplot()
    rows = result["rows"]
    entries = [e for e in ENTRY_ORDER if any(r["entry"] == e for r in rows)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    directions = (("save", "save_gbs", "memcpy_d2h_gbs"), ("load", "load_gbs", "memcpy_h2d_gbs"))
    for ax, (direction, ours, base) in zip(axes, directions, strict=True):
        for batch, style in ((1, "o-"), (32, "s:")):
            picked = [r for r in rows if r["batch"] == batch]
            if not picked:
                continue
            xs = list(range(len(entries)))

            def medians(key: str, layout: str | None = None, picked=picked) -> list[float]:
                return [
                    median(
                        [r[key] for r in picked if r["entry"] == e and layout in (None, r["layout"])] or [0]
                    )
                    for e in entries
                ]

            ax.plot(
                xs, medians(base), "k" + style, alpha=0.6, label=f"contiguous pinned memcpy, batch {batch}"
            )
            for layout in sorted({r["layout"] for r in picked}):
                ax.plot(xs, medians(ours, layout), style, label=f"ours, {layout}, batch {batch}")
        ax.set_xticks(range(len(entries)), entries)
        ax.set_xlabel("entry size (median over 2/7/32 KiB rows)")
        ax.set_title(f"{direction}: {'device -> region' if direction == 'save' else 'region -> device'}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GB/s")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"TorchCopier against memcpy on {result.get('name', result.get('device', '?'))}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def p2p(result: dict[str, Any], path: Path) -> None:
    """NIXL READ GiB/s against entry size per UCX error mode, beside a plain copy of the same bytes."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    copies: dict[int, list[float]] = defaultdict(list)
    for mode in result["modes"]:
        flow = sorted(mode["flow"], key=lambda row: row["size_mib"])
        pthread = "on" if mode["progress_thread"] else "off"
        xs = [row["size_mib"] for row in flow]
        ax.plot(
            xs,
            [row["read_gibs"] for row in flow],
            marker="o",
            label=f"ours: ZMQ ack + NIXL READ ({mode['mode']}, progress thread {pthread})",
        )
        for row in flow:
            copies[row["size_mib"]].append(row["memcpy_gibs"])
    xs = sorted(copies)
    ax.plot(xs, [median(copies[x]) for x in xs], "k--", marker="s", label="plain memcpy of the same bytes")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("entry size (MiB)")
    ax.set_ylabel("GiB/s")
    ax.set_title("P2P READ, same host (127.0.0.1)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
