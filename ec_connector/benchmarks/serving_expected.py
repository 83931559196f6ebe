"""The hit ratios a serving workload's own requests give in a replay of our table (no engine).

The serving bench's measured hit ratio comes from engines; this module gives, from the trace
alone and in milliseconds, what the eviction policies make of the same requests, so a report can
print "expected" beside "measured". The workload's requests, in order, one a step, are replayed
through our EntryTable (replay.py's `replay_hits`, as bench/eviction.py does) with `fifo` (the
order vLLM's ECCPUConnector evicts in), `s3fifo` and the shipped default (`duel`; ours' policy too
when the run sets one: `ours_eviction`), and with Belady's offline MIN
(the reference no online policy beats by much); the fill is served but only the measured passes
count. Blocks are 7 KiB rows (a hidden-3584 bf16 model, cache_traces.ROW_BYTES): an image takes
ceil(item bytes / 7 KiB) blocks, the region floor(region bytes / 7 KiB).

An engine serves a run's workloads one after the other, so the region a workload meets holds what
the earlier ones left: the replay serves those first (`history`), unmeasured, as the engine did.
What they leave matters to a policy that keeps what was read: after `repeat`, `s3fifo`'s main
queue holds the repeat pool's images, which a pressure fill pushes out only slowly. The
per-replica replays run the same policies; the pair's runs ours' (`ours_eviction`, else the
default, `default_eviction`): the fleet arms run ours' connector config.

What the replay leaves out: vLLM's own GPU encoder cache (a few images; it adds hits to every
arm, `none` included), requests in flight at once (a repeat of an image whose save has not
landed encodes again), and failed saves. A measured ratio a little above the expected one is
vLLM's cache; one far off means the tier did not do what the table does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ec_connector.benchmarks.cache_sides import OursSide
from ec_connector.benchmarks.cache_traces import ROW_BYTES, engine_trace
from ec_connector.benchmarks.replay import BeladyPolicy, RequestClock, replay_hits, request_positions
from ec_connector.benchmarks.replay_pair import replay_pair
from ec_connector.benchmarks.serving_engine import replica_for
from ec_connector.domain.eviction import DEFAULT_POLICY, FIFO, S3FIFO
from ec_connector.domain.pull_rule import PullRule

ONLINE: tuple[str, ...] = tuple(dict.fromkeys((FIFO, S3FIFO, DEFAULT_POLICY)))


def hit_ratios(
    requests: Sequence[int],
    count_from: int,
    rows: int | Sequence[int],
    num_blocks: int,
    policies: Sequence[str] = ONLINE,
) -> dict[str, float]:
    """Hit ratio of the requests from index `count_from` on, per policy (`policies`, then belady),
    after the earlier ones were served in the same region; `rows`: every image's blocks, or each
    request's."""
    trace = engine_trace(list(requests), rows, num_blocks, "serving")
    out = {}
    for policy in policies:
        res = replay_hits(OursSide(num_blocks, eviction=policy), trace, count_from=count_from)
        out[policy] = 1.0 - res["miss_ratio"]
    clock = RequestClock()
    side = OursSide(num_blocks)
    side.table._policy = BeladyPolicy(side.table._evictable, request_positions(trace), clock)
    out["belady"] = 1.0 - replay_hits(side, trace, clock, count_from=count_from)["miss_ratio"]
    return out


def expected(
    wl: dict[str, Any],
    item_bytes: int,
    region_bytes: int,
    replicas: int = 1,
    rule: PullRule | None = None,
    ours_policy: str | None = None,
    history: Sequence[tuple[dict[str, Any], int]] = (),
) -> dict[str, Any]:
    """Expected hit ratios of workload `wl` (Workload.to_dict()) on its measured passes: one region
    of `region_bytes` serving every request and, with `replicas` > 1, each replica's region
    (`region_bytes` / `replicas`) serving the requests the round-robin client sends it (request i of
    a pass to replica i % replicas), their hits summed (what per-replica tiers get); with two, also
    the pair pulling from each other (`expected_hit_ratio_fleet`: replay_pair.py, the pull `rule`
    the fleet's replicas run with (default: the shipped one) and copies evicted first; a pull counts
    as a hit, as the bench counts it). `ours_policy` (ours' `ec_eviction` when the run sets one) is
    replayed in the one region beside ONLINE and recorded as `ours_eviction`. `history`: the
    workloads, each with its item bytes, that the same engine served before this one, replayed
    first and not counted (`expected_after_requests` records how many requests they were)."""
    served = [(p, b) for w, b in history for p in w["passes"]] + [(p, item_bytes) for p in wl["passes"]]
    first = len(served) - len(wl["passes"])
    first += next((n for n, p in enumerate(wl["passes"]) if p["measured"]), len(wl["passes"]))
    # every request the engine served, in order: its image, its blocks and (round-robin) its replica
    flat = [s for p, _ in served for s in p["seeds"]]
    flat_rows = [max(1, math.ceil(b / ROW_BYTES)) for p, b in served for _ in p["seeds"]]
    routes = [replica_for(i, replicas) for p, _ in served for i in range(len(p["seeds"]))]
    skip = sum(len(p["seeds"]) for p, _ in served[:first])
    policies = ONLINE if ours_policy is None or ours_policy in ONLINE else (*ONLINE, ours_policy)
    whole = hit_ratios(flat, skip, flat_rows, region_bytes // ROW_BYTES, policies)
    out: dict[str, Any] = {"expected_hit_ratio": _rounded(whole), "default_eviction": DEFAULT_POLICY}
    if history:
        out["expected_after_requests"] = len(flat) - sum(len(p["seeds"]) for p in wl["passes"])
    if ours_policy:
        out["ours_eviction"] = ours_policy
    if replicas > 1:
        blocks = region_bytes // replicas // ROW_BYTES
        per: dict[str, float] = dict.fromkeys(policies, 0.0)
        counted = 0
        for k in range(replicas):
            mine = [i for i, r in enumerate(routes) if r == k]
            before = sum(1 for i in mine if i < skip)
            rows = [flat_rows[i] for i in mine]
            ratios = hit_ratios([flat[i] for i in mine], before, rows, blocks, policies)
            for policy in policies:
                per[policy] += ratios[policy] * (len(mine) - before)
            counted += len(mine) - before
        out["expected_hit_ratio_per_replica"] = _rounded({p: v / max(1, counted) for p, v in per.items()})
        if replicas == 2:
            pair_policy = ours_policy or DEFAULT_POLICY
            sides = [OursSide(blocks, eviction=pair_policy) for _ in range(2)]
            trace = engine_trace(flat, flat_rows, 0, "serving")
            fleet = replay_pair(
                trace, sides, share=True, rule=rule, count_from=skip, replica_of=routes.__getitem__
            )
            out["expected_hit_ratio_fleet"] = {pair_policy: round(fleet["hit_ratio"], 4)}
    return out


def _rounded(ratios: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 4) for k, v in ratios.items()}
