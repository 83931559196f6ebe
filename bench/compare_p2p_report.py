"""The report of `bench/compare_p2p.py`: its figures as a text table and as a PNG of bars.

Both read the dict `run` returns (params, environment, per side `per_size` medians, ratios, goals)
and nothing else, so a saved `--json` can be drawn again.
"""

from __future__ import annotations

from pathlib import Path

from bench.compare_p2p_items import MiB
from ec_connector.benchmarks.output import goal_lines, pyplot


def plot(res: dict, path: str) -> None:
    plt = pyplot()

    sizes = res["params"]["sizes_mib"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.5))
    xs = range(len(sizes))
    w = 0.38
    for ax, key, title, ylabel, log in (
        (axes[0], "e2e_ms", "request -> bytes verified (median)", "ms per item", True),
        (axes[1], "ack_bytes", "XferAck size", "bytes (log)", True),
        (axes[2], "descriptors", "NIXL descriptors per READ", "descriptors (log)", True),
    ):
        o = [res["ours"]["per_size"][str(m)][key] for m in sizes]
        b = [res["vllm"]["per_size"][str(m)][key] for m in sizes]
        ax.bar([x - w / 2 for x in xs], o, w, label="ours", color="tab:blue")
        ax.bar([x + w / 2 for x in xs], b, w, label="vLLM in-tree", color="tab:orange")
        ax.set_xticks(list(xs), [f"{m} MiB" for m in sizes])
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    fig.suptitle(
        f"Producer -> consumer over NIXL on 127.0.0.1: ours vs vLLM {res['environment']['vllm']} in-tree "
        f"({res['params']['rounds']} rounds x {res['params']['reps']} reps)"
    )
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render(res: dict) -> str:
    if res.get("skipped"):
        return f"SKIPPED: {res['skipped']}"
    p = res["params"]
    lines = [
        f"{p['rounds']} rounds x {p['reps']} reps per size, alternating; regions: producer "
        f"{p['producer_region_bytes'] / MiB:.0f} MiB, consumer {p['consumer_region_bytes'] / MiB:.0f} MiB; "
        f"prefault {p['prefault_regions']}; UCX_TLS={p['ucx_tls']}; vllm {res['environment']['vllm']}, "
        f"ours: nixl_read_lanes {p.get('read_lanes') or 'default'}, "
        f"load avg {res['environment']['load_avg']:.2f}",
        f"{'MiB':>4} | {'e2e ms':>8} {'vllm':>8} {'ratio':>6} | {'read ms':>8} {'vllm':>8} {'ratio':>6} | "
        f"{'ack B':>7} {'vllm':>9} | {'descs':>5} {'vllm':>6}",
    ]
    for mib in p["sizes_mib"]:
        o, b, r = (
            res["ours"]["per_size"][str(mib)],
            res["vllm"]["per_size"][str(mib)],
            res["ratios"][str(mib)],
        )
        lines.append(
            f"{mib:>4} | {o['e2e_ms']:>8.2f} {b['e2e_ms']:>8.2f} {r['e2e_ms']:>6.2f} | "
            f"{o['read_ms']:>8.2f} {b['read_ms']:>8.2f} {r['read_ms']:>6.2f} | "
            f"{o['ack_bytes']:>7.0f} {b['ack_bytes']:>9.0f} | "
            f"{o['descriptors']:>5.0f} {b['descriptors']:>6.0f}"
        )
    starts = ", ".join(
        f"{m} MiB {res['ours']['per_size'][str(m)]['start_read_ms']:.2f}" for m in p["sizes_mib"]
    )
    lines.append(f"ours: ms inside NixlPeerTransport.start_read (post of the READ), median: {starts}")
    for side in ("ours", "vllm"):
        lines.append(f"{side}: UCX error mode {res[side]['ucx_error_mode']}")
        cold = ", ".join(f"{x:.1f}" for x in res[side]["cold_e2e_ms"])
        lines.append(f"{side}: first item after connecting (1 MiB) e2e ms: {cold}")
    lines.append(
        f"ack bytes at a 2 GiB region: ours {res['ours']['ack_bytes_2gib_region']:.0f}, "
        f"vllm {res['vllm']['ack_bytes_2gib_region']}"
    )
    lines += goal_lines(res["goals"])
    return "\n".join(lines)
