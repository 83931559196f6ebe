"""E→PD on one GPU: an `ec_producer` engine encodes, an `ec_consumer` engine reads over NIXL.

Two engine processes share the GPU (a quarter of its memory each), NIXL on, side channels on
127.0.0.1. The producer serves the whole workload first and publishes each request's
`ec_transfer_params`; the consumer (the orchestrator's role is the test's: it forwards the params)
serves the first requests from the producer's encodings, then pauses while the test SIGKILLs the
producer, then serves the rest, whose producer is gone: it must encode them itself, within its
bounds (ack timeout 2 s, READ timeout 20 s). Every output is compared with an engine without a
connector; no region file may be left once both engines are gone.
"""

from __future__ import annotations

import json
import signal
import sys
import uuid
from pathlib import Path

import pytest

from .conftest import Target
from .harness import (
    ENGINE_DIR,
    engine_env,
    kill_group,
    region_files,
    run_driver,
    start,
    tail,
    wait_exit,
    wait_until,
)

IMAGES = 8
WORKLOAD = [[0], [1], [2, 3], [0, 4], [5], [6, 7]]
PAUSE_AFTER = 3  # the consumer serves requests 0-3 from the producer; 4-5 after it was killed
SERVED = {i for request in WORKLOAD[: PAUSE_AFTER + 1] for i in request}
ORPHANED = {i for request in WORKLOAD[PAUSE_AFTER + 1 :] for i in request}
ACK_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 20.0
BOUND_SLACK_S = 10.0  # a request past its fallback bounds by more than this was blocked
MEMORY_SHARE = 0.25
ENGINE_LIMIT_S = 240


def connector(role: str, engine_id: str) -> dict:
    return {
        "ec_connector": "ECTierConnector",
        "ec_connector_module_path": "ec_connector.entrypoints.vllm",
        "ec_role": role,
        "engine_id": engine_id,
        "ec_connector_extra_config": {
            "ec_cpu_bytes": 1 << 20,
            "ec_enable_nixl": "true",
            "consumer_ack_timeout_s": ACK_TIMEOUT_S,
            "read_timeout_s": READ_TIMEOUT_S,
        },
    }


def spec(target: Target, config: dict | None, **extra) -> dict:
    return {
        "device": target.device,
        "eager": True,
        "gpu_memory_utilization": MEMORY_SHARE,
        "connector": config,
        "images": IMAGES,
        "workload": WORKLOAD,
        **extra,
    }


def progress(work: Path) -> list[dict]:
    """The consumer's progress records so far (a line still being written is left for the next look)."""
    path = work / "progress.jsonl"
    records = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


@pytest.fixture(scope="module")
def epd(target: Target, tiny_vlm_dir: Path, tmp_path_factory) -> dict:
    runner = "v1" if target.device == "cpu" else "v2"  # the CPU build has only the V1 runner
    work = tmp_path_factory.mktemp("epd")
    limit_s = ENGINE_LIMIT_S * target.slowdown
    env = engine_env(
        target.device,
        runner,
        VLLM_EC_SIDE_CHANNEL_HOST="127.0.0.1",
        VLLM_EC_SIDE_CHANNEL_PORT="0",  # any free port: the producer advertises the one it got
    )
    (work / "reference.spec.json").write_text(json.dumps(spec(target, None)))
    run_driver(
        "local.py",
        [str(tiny_vlm_dir), str(work / "reference.json"), str(work / "reference.spec.json")],
        env,
        work / "reference.log",
        limit_s,
    )
    ids = {"producer": f"gpu-e-{uuid.uuid4().hex[:6]}", "consumer": f"gpu-pd-{uuid.uuid4().hex[:6]}"}
    (work / "producer.spec.json").write_text(
        json.dumps(spec(target, connector("ec_producer", ids["producer"]), serve_s=4 * limit_s))
    )
    (work / "consumer.spec.json").write_text(
        json.dumps(
            spec(target, connector("ec_consumer", ids["consumer"]), pause_after=PAUSE_AFTER, pause_s=limit_s)
        )
    )
    script = str(ENGINE_DIR / "epd.py")

    logs = {role: work / f"{role}.log" for role in ids}

    def driver(role: str) -> list[str]:
        return [sys.executable, script, role, str(tiny_vlm_dir), str(work), str(work / f"{role}.spec.json")]

    producer = start(driver("producer"), env, logs["producer"])
    consumer = None
    try:
        wait_until(
            lambda: (work / "params.json").exists(),
            limit_s,
            "producer publishes",
            producer,
            logs["producer"],
        )
        consumer = start(driver("consumer"), env, logs["consumer"])
        paused = wait_until(
            lambda: next((r for r in progress(work) if "paused" in r), None),
            limit_s,
            "consumer serves the first requests",
            consumer,
            logs["consumer"],
        )
        assert producer.poll() is None, f"the producer exited early:\n{tail(logs['producer'])}"
        kill_group(producer, signal.SIGKILL)
        (work / "go").touch()
        wait_exit(consumer, logs["consumer"], limit_s, "consumer")
    finally:
        for proc in (producer, consumer):
            if proc is not None and proc.poll() is None:
                kill_group(proc)
    report = {
        "runner": runner,
        "ids": ids,
        "reference": json.loads((work / "reference.json").read_text()),
        "params": json.loads((work / "params.json").read_text()),
        "consumer": json.loads((work / "consumer.json").read_text()),
        "before_kill": paused["stats"],
        "producer_killed_by": -producer.returncode,
        "target": target,
    }
    c = report["consumer"]
    print(
        f"\nE→PD ({runner}): consumer {json.dumps(c['engine'])}\n  per request s: "
        f"{[round(r['seconds'], 2) for r in c['requests']]}"
        f"\n  before kill: {json.dumps(report['before_kill'])}"
        f"\n  at the end: {json.dumps(c['stats'])}"
    )
    return report


def test_the_producer_publishes_every_item(epd):
    for published, request in zip(epd["params"], WORKLOAD, strict=True):
        items = published["params"]
        assert items and len(items) == len(set(request)), published
        for item in items.values():
            assert item["peer_host"] == "127.0.0.1" and item["size_bytes"] > 0


def test_the_consumer_runs_no_encoder_for_served_items_and_matches_local_encoding(epd):
    consumer, reference = epd["consumer"], epd["reference"]
    served = consumer["requests"][: PAUSE_AFTER + 1]
    assert all(r["encoded"] == [] for r in served), [r["encoded"] for r in served]
    before = epd["before_kill"]
    assert before.get("peer_reads_done", 0) >= len(SERVED)
    assert before.get("peer_fallbacks", 0) == 0
    assert [r["token_ids"] for r in consumer["requests"]] == [r["token_ids"] for r in reference["requests"]]
    if epd["target"].device == "cuda":
        assert consumer["engine"]["runner"].startswith("vllm.v1.worker.gpu."), consumer["engine"]


def test_a_killed_producer_costs_local_encodes_within_the_bounds(epd):
    assert epd["producer_killed_by"] == signal.SIGKILL
    consumer = epd["consumer"]
    after = consumer["requests"][PAUSE_AFTER + 1 :]
    encoded = [key for r in after for key in r["encoded"]]
    assert len(encoded) == len(set(encoded)) == len(ORPHANED)
    assert all(r["finish_reason"] == "length" for r in after)
    for r in after:
        assert r["seconds"] < ACK_TIMEOUT_S + READ_TIMEOUT_S + BOUND_SLACK_S, r
    stats, before = consumer["stats"], epd["before_kill"]
    assert stats.get("peer_fallbacks", 0) - before.get("peer_fallbacks", 0) >= len(ORPHANED)
    assert stats.get("peer_reads_done", 0) == before.get("peer_reads_done", 0)


def test_no_region_file_is_left_once_both_engines_stopped(epd):
    for engine_id in epd["ids"].values():
        assert region_files(engine_id) == []
