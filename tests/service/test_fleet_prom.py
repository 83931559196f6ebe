"""The fleet's counters as Prometheus series: every `FleetStats` field reaches a `vllm:ec_fleet_*`
series with a row in docs/metrics.md, counters add increments, the directory's levels add up their
changes, and a report without `fleet_*` keys (no fleet) leaves them at 0.

prom.py and metadata.py import vLLM, which this venv lacks: the checks run under the vLLM venv's
python (`.venv-vllm`, as the engine tests), with prometheus_client's own metric classes."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from ec_connector.application.fleet import FleetStats

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
DOCS = ROOT / "docs" / "metrics.md"

SCRIPT = r"""
import json, sys
from types import SimpleNamespace
from prometheus_client import REGISTRY, Counter, Gauge, Histogram, generate_latest
from ec_connector.entrypoints.vllm.metadata import ECTierStats
from ec_connector.entrypoints.vllm.prom import COUNTERS, LEVEL_GAUGES, ECTierPromMetrics, series_names

fields = json.loads(sys.argv[1])
prom = ECTierPromMetrics(
    SimpleNamespace(ec_transfer_config=None), {Counter: Counter, Gauge: Gauge, Histogram: Histogram},
    ["model_name", "engine"], {0: ["m", "0"]},
)
exported = {key for *_, keys in COUNTERS for key in keys.values()} | {key for *_, key in LEVEL_GAUGES}
prom.observe({"hits": 1, "entries": 2})  # a replica without a fleet: no fleet_* key
quiet = generate_latest(REGISTRY).decode()
first = {f"fleet_{name}": 1 for name in fields}
first["fleet_directory_records"] = 5
second = {"fleet_pulls_done": 2, "fleet_directory_records": -2, "fleet_peers_live": 0}
merged = ECTierStats(data=dict(first)).aggregate(ECTierStats(data=dict(second))).data
prom.observe(first)
prom.observe(second)
print(json.dumps({
    "unexported": sorted(set(first) - exported),
    "series": series_names(),
    "merged_records": merged["fleet_directory_records"],
    "quiet": [l for l in quiet.splitlines() if l.startswith("vllm:ec_fleet") and not l.endswith(" 0.0")
              and "_created" not in l],
    "after": [l for l in generate_latest(REGISTRY).decode().splitlines() if l.startswith("vllm:ec_fleet")
              and "_created" not in l],
}))
"""


@pytest.fixture(scope="module")
def observed() -> dict:
    if not VLLM_PYTHON.exists():
        pytest.skip(f"vLLM test env not found at {VLLM_PYTHON} (tools/setup_vllm_env.sh builds it)")
    fields = list(FleetStats().as_dict())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_NO_USAGE_STATS": "1"}
    out = subprocess.run(
        [str(VLLM_PYTHON), "-c", SCRIPT, json.dumps(fields)],
        env=env, capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def sample(lines: list[str], name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in {"engine": "0", "model_name": "m", **labels}.items()]
    hits = [line for line in lines if line.startswith(name + "{") and all(w in line for w in want)]
    assert len(hits) == 1, (name, labels, hits)
    return float(hits[0].rsplit(" ", 1)[1])


def test_every_fleet_counter_is_a_series_with_a_row_in_the_docs(observed):
    assert observed["unexported"] == []
    documented = set(re.findall(r"^\| `(vllm:ec_fleet_[a-z_]+)` \|", DOCS.read_text(), re.M))
    fleet_series = {name for name in observed["series"] if name.startswith("vllm:ec_fleet_")}
    assert len(fleet_series) >= 15 and documented == fleet_series


def test_a_replica_without_a_fleet_leaves_the_fleet_series_at_zero(observed):
    assert observed["quiet"] == []


def test_counters_add_increments_and_levels_add_up_their_changes(observed):
    after = observed["after"]
    assert sample(after, "vllm:ec_fleet_pulls_ended_total", outcome="done") == 3
    assert sample(after, "vllm:ec_fleet_pulls_ended_total", outcome="failed") == 1
    assert sample(after, "vllm:ec_fleet_pulls_skipped_total", reason="size_mismatch") == 1
    assert sample(after, "vllm:ec_fleet_peers_left_total", how="silent") == 1
    assert sample(after, "vllm:ec_fleet_feed_rejected_total") == 1
    assert sample(after, "vllm:ec_fleet_directory_records") == 3
    assert sample(after, "vllm:ec_fleet_peers_live") == 1
    assert observed["merged_records"] == 3, "the log line's aggregate sums a level's changes"
