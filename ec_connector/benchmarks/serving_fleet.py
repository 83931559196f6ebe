"""One arm of the serving benchmark's fleet workloads: replicas behind a round-robin client, one process.

    python -m ec_connector.benchmarks.serving_fleet SPEC_JSON   (started by the bench, --workloads fleet)

SPEC["replicas"] lists the engines, each an `AsyncLLM` with its own EngineCore process on the one
device, each with the memory share of SPEC["engine"]:
- arm ``upstream``: two replicas, vLLM's ECCPUConnector ``ec_both``, a region each (no
  orchestrator, so nothing moves between them);
- arm ``local``: two replicas, ours ``ec_both``, a region each;
- arm ``fleet``: ``local`` with fleet sharing (SPEC["fleet"] set): NIXL on, each replica publishes
  its event feed and lists the other in ``fleet_peers``, one ``side_channel_secret``; a replica
  that misses an item the other holds reads it from the other's region;
- arm ``single``: one replica, ours, holding both regions' bytes: the hit-ratio reference.
Request i of a pass goes to replica i % len(replicas). Encoder items are counted per replica
(EC_BENCH_ENGINE = the replica's name). Ours' fleet and peer counters (pulls, reads) are read
from the connector's stats through a stat logger handed to `AsyncLLM` (`stat_loggers`), which
also turns vLLM's scheduler stats on; every arm gets it, so they pay alike.

Output and exit codes as serving_engine.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import time
from collections.abc import Sequence
from typing import Any

from ec_connector.benchmarks.ports import free_port
from ec_connector.benchmarks.serving_engine import (
    MiB,
    Results,
    child_main,
    connector_config,
    counter_logger,
    cpu_note,
    encoder_items,
    exit_child,
    pull_figures,
    replica_for,
    run_pass,
    say,
    start,
    summarize,
    write_workload,
)
from ec_connector.benchmarks.serving_workload import Workload
from ec_connector.domain.config import ConnectorConfig, Role, parse_fleet_config
from ec_connector.domain.pull_rule import PullRule

FLEET_ARMS = ("upstream", "local", "fleet", "single")
# Seconds the replicas get after start (peers subscribe to each other's feed) and after each pass
# (the feed carries the pass's `stored` events to the other replica's directory): not measured.
SETTLE_S = 2.0
PASS_SETTLE_S = 1.0


# The tiny model's items are 4-16 rows: a real encoder's ~10 us a row beats any pull, so the
# fleet's pull rule would refuse them all; the CPU run pretends the encoder is slow.
TINY_FLEET_EXTRA = {"fleet_encode_us_per_row": 100_000.0}


def fleet_extra(args: argparse.Namespace) -> dict[str, Any]:
    """Extra connector keys of the fleet arm: --fleet-extra, else TINY_FLEET_EXTRA for the tiny shape."""
    if args.fleet_extra:
        return dict(json.loads(args.fleet_extra))
    return dict(TINY_FLEET_EXTRA) if args.shape == "tiny" and not args.model else {}


def fleet_rule(args: argparse.Namespace) -> PullRule:
    """The pull rule the fleet arm's replicas run with: its extra keys over the defaults."""
    tier = ConnectorConfig(role=Role.BOTH, cpu_bytes=args.region_mib * MiB, enable_nixl=True)
    return parse_fleet_config(fleet_extra(args), tier).pull_rule()


def fleet_spec(args: argparse.Namespace, spec: dict[str, Any], run_id: str, tag: str) -> dict[str, Any]:
    """Fleet arms: the replicas (two, a region each; `single`: one with both regions' bytes),
    each with the arm's connector, and the same memory share for every engine."""
    arm, region = spec["arm"], args.region_mib * MiB
    n = 1 if arm == "single" else 2
    kind = "upstream" if arm == "upstream" else "ours"
    spec["replicas"] = [
        {
            "name": f"replica{k}",
            "connector": connector_config(
                kind, region * (3 - n), f"bench-{run_id}-{tag}-{k}", ours_extra=args.ours_extra
            ),
        }
        for k in range(n)
    ]
    spec["fleet"] = fleet_extra(args) if arm == "fleet" else None
    spec["engine"]["gpu_memory_utilization"] = args.gpu_memory_utilization or args.fleet_mem
    return spec


def cross_replica_repeats(passes: list[list[int]], replicas: int) -> int:
    """Requests of the measured passes (all but the first) whose image the round-robin client
    (request i to replica i % `replicas`) has sent before, but only to other replicas: what a
    per-replica tier must encode again and a fleet can pull."""
    seen: dict[int, set[int]] = {}
    cross = 0
    for n, seeds in enumerate(passes):
        for i, seed in enumerate(seeds):
            k = replica_for(i, replicas)
            if n and seed in seen and k not in seen[seed]:
                cross += 1
            seen.setdefault(seed, set()).add(k)
    return cross


def replica_wiring(
    replicas: list[dict[str, Any]], fleet: dict[str, Any] | None, ports: list[tuple[int, int]], secret: str
) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """Each replica's (ec_transfer_config, environment): its side channel on 127.0.0.1:ports[k][0]
    (VLLM_EC_SIDE_CHANNEL_HOST/PORT, set around its start); with `fleet` (extra connector keys,
    possibly empty) also NIXL on, its event feed on tcp://127.0.0.1:ports[k][1], every other
    replica in `fleet_peers`, and one `side_channel_secret` for all."""
    out = []
    for k, rep in enumerate(replicas):
        side, feed = ports[k]
        config = {
            **rep["connector"],
            "ec_connector_extra_config": dict(rep["connector"]["ec_connector_extra_config"]),
        }
        if fleet is not None:
            peers = [
                {
                    "engine_id": other["connector"]["engine_id"],
                    "event_feed": f"tcp://127.0.0.1:{ports[j][1]}",
                    "peer_host": "127.0.0.1",
                    "peer_port": ports[j][0],
                }
                for j, other in enumerate(replicas)
                if j != k
            ]
            config["ec_connector_extra_config"].update(
                ec_enable_nixl=True,
                event_feed_address=f"tcp://127.0.0.1:{feed}",
                fleet_peers=peers,
                side_channel_secret=secret,
                **fleet,
            )
        env = {"VLLM_EC_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_EC_SIDE_CHANNEL_PORT": str(side)}
        out.append((config, env))
    return out


def counter_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def pass_figures(
    rows: list[tuple[float, float, int]],
    wall: float,
    items: int,
    per_replica: list[int],
    counters: dict[str, int],
    fetches: Sequence[float] = (),
    *,
    per_request: bool = False,
) -> dict[str, Any]:
    """`summarize`'s figures over every replica, with each replica's encoder items, the connector
    counters the pass moved (summed over replicas) and, where pulls ended, their p50/p99 in ms."""
    figures = summarize(rows, wall, items, sum(per_replica), per_request=per_request)
    figures["replica_encoder_items"] = per_replica
    if any(k.startswith("fleet_") for k in counters):
        figures["fleet_pulls"] = counters.get("fleet_pulls_done", 0)
    figures.update(pull_figures(fetches))
    figures["counters"] = counters
    return figures


def add_pass(
    total: dict[str, Any],
    rows: list,
    wall: float,
    items: int,
    per: list[int],
    ctr: dict,
    fetches: list[float],
) -> None:
    """Accumulate one measured pass into `total` (rows, wall, items, per-replica items, counters,
    pull durations)."""
    total["rows"] += rows
    total["wall"] += wall
    total["items"] += items
    total["per"] = [a + b for a, b in zip(total["per"], per, strict=True)]
    total["fetches"] += fetches
    for k, v in ctr.items():
        total["counters"][k] = total["counters"].get(k, 0) + v


async def serve(spec: dict, out: Results, hook_dir: str) -> None:
    import vllm

    arm = spec["arm"]
    ports = [(free_port(), free_port()) for _ in spec["replicas"]]
    wiring = replica_wiring(spec["replicas"], spec.get("fleet"), ports, secrets.token_hex(16))
    totals: list[dict[str, int]] = [{} for _ in spec["replicas"]]
    fetches: list[float] = []  # every replica's pull durations, in the order their stats arrive
    names = [rep["name"] for rep in spec["replicas"]]
    started = time.perf_counter()
    engines: list[Any] = []
    try:
        for name, (config, env), tot in zip(names, wiring, totals, strict=True):
            kwargs = {**spec["engine"], "ec_transfer_config": config}
            engines.append(start(kwargs, name, env, stat_loggers=[counter_logger(tot, fetches)]))
        start_s = time.perf_counter() - started
        runner = "v2" if getattr(engines[0].vllm_config, "use_v2_model_runner", False) else "v1"
        out.write(
            "engine", start_s=start_s, vllm=vllm.__version__, runner=runner, pid=os.getpid(), replicas=names
        )
        say(f"{arm}: {len(engines)} replica(s) up in {start_s:.1f} s (vLLM {vllm.__version__}, {runner})")
        await asyncio.sleep(SETTLE_S)
        for wd in spec["workloads"]:
            wl = Workload.from_dict(wd)
            await serve_workload(spec, out, hook_dir, engines, names, (totals, fetches), wl)
    finally:
        for engine in engines:
            engine.shutdown()


async def serve_workload(
    spec: dict,
    out: Results,
    hook_dir: str,
    engines: list[Any],
    names: list[str],
    stats: tuple[list[dict[str, int]], list[float]],
    wl: Workload,
) -> None:
    totals, fetches = stats
    passes: list[dict[str, Any]] = []
    total: dict[str, Any] = {
        "rows": [], "wall": 0.0, "items": 0, "per": [0] * len(names), "counters": {}, "fetches": []
    }  # fmt: skip
    for p in wl.passes:
        before = [encoder_items(hook_dir, n) for n in names]
        ctr_before = sum_counters(totals)
        fetched_before = len(fetches)
        rows, wall, cpu = await run_pass(engines, spec, wl, p.label, p.seeds, f"{spec['tag']}-{wl.key}")
        await asyncio.sleep(PASS_SETTLE_S)  # the last steps' stats and the feed's events arrive
        per = [encoder_items(hook_dir, n) - b for n, b in zip(names, before, strict=True)]
        ctr = counter_delta(ctr_before, sum_counters(totals))
        pulls = fetches[fetched_before:]
        figures = pass_figures(rows, wall, len(p.seeds), per, ctr, pulls, per_request=p.measured)
        passes.append({"label": p.label, "measured": p.measured, **figures, "cpu": cpu})
        say(
            f"{spec['arm']} {wl.key} {p.label}: {len(rows)} req in {wall:.2f} s, encoder items {per}, "
            f"fleet pulls {figures.get('fleet_pulls', '-')} (p50 {figures.get('pull_p50_ms', '-')} ms), "
            f"TTFT p50 {figures['ttft_p50_ms'] or 0:.0f} ms{cpu_note(cpu)}"
        )
        if p.measured:
            add_pass(total, rows, wall, len(p.seeds), per, ctr, pulls)
    measured = pass_figures(
        total["rows"], total["wall"], total["items"], total["per"], total["counters"], total["fetches"]
    )
    write_workload(out, wl, measured, passes)


def sum_counters(totals: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for tot in totals:
        for k, v in tot.items():
            out[k] = out.get(k, 0) + v
    return out


def main() -> int:
    return child_main(
        serve, lambda spec: {**spec["engine"], "ec_transfer_config": spec["replicas"][0]["connector"]}
    )


if __name__ == "__main__":
    exit_child(main)
