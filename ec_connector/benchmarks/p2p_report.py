"""The P2P benchmark's printed report (p2p.py's `run` result as a table)."""

from __future__ import annotations

from typing import Any


def print_report(result: dict[str, Any]) -> None:
    host = result["host"]
    print(
        f"\ncpus={host['cpus']}  load avg at start={host['loadavg_at_start']:.2f}  UCX_TLS={host['ucx_tls']}"
        f"  nixl {host['nixl']}  rows {result['config']['row_bytes']} B"
    )
    print(
        f"{'mode':<5} {'pthr':>4} {'MiB':>3} {'runs':>4} {'READ GiB/s':>10} {'memcpy GiB/s':>12} "
        f"{'ratio':>5} {'in start_read':>13} {'ack p50/p99 us':>15} {'ack B':>5} {'e2e p50/p99 ms':>15} "
        f"{'fetcher p50 ms':>14} {'1st e2e ms':>10}"
    )
    for mode in result["modes"]:
        for row in mode["flow"]:
            ack, e2e = row["ack_rtt_us"], row["e2e_ms"]
            fetch = mode["fetcher_e2e_ms"][str(row["size_mib"])]
            pthr = "on" if mode["progress_thread"] else "off"
            print(
                f"{mode['mode']:<5} {pthr:>4} {row['size_mib']:>3} {row['runs']:>4} "
                f"{row['read_gibs']:>10.2f} {row['memcpy_gibs']:>12.2f} {row['ratio']:>5.2f} "
                f"{row['start_read_ms']['p50'] / row['read_ms']['p50']:>13.0%} "
                f"{ack['p50']:>7.0f}/{ack['p99']:<7.0f} {row['ack_bytes']:>5} "
                f"{e2e['p50']:>7.2f}/{e2e['p99']:<7.2f} {fetch['p50']:>14.2f} {row['first']['e2e_ms']:>10.1f}"
            )
    for mode in result["modes"]:
        loop = mode["ack_loop"]
        print(
            f"ack loop [{mode['mode']}, progress thread {'on' if mode['progress_thread'] else 'off'}]: "
            f"n={loop['n']} p50 {loop['ack_rtt_us']['p50']:.0f} us, "
            f"p99 {loop['ack_rtt_us']['p99']:.0f} us"
        )
    for d in result["producer_death"]:
        print(f"producer killed {d['case'].replace('_', ' ')} [{d['mode']}, {d['transport']}]: {outcomes(d)}")
    for h in result["hung_producer"]:
        print(f"READ from a SIGSTOPped producer [{h['mode']}]: {h['state']} after {h['ms']:.0f} ms")


def outcomes(death: dict[str, Any]) -> str:
    """One producer-death case in a line: how many trials ended each way, with their times."""
    parts = []
    for outcome, ms in sorted(death["outcomes_ms"].items()):
        label = f"still pending at {death['bound_s']:g} s" if outcome == "pending" else outcome
        parts.append(f"{len(ms)}x {label} ({', '.join(f'{x:.1f}' for x in ms)} ms)")
    return "; ".join(parts)
