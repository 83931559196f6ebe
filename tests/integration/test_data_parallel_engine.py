"""A producer served with data parallelism: each rank of one instance gets its own tier.

`vllm serve --data-parallel-size 2` of the tiny (dense) VLM runs the two ranks as independent
engines, each with `data_parallel_rank` reset to 0. Each rank must still open its own region file,
NIXL agent, side-channel server and event feed (they shared dp0's before), serve requests, and leave
no region file behind after shutdown.
"""

from __future__ import annotations

import re
import time
import uuid

import pytest
import zmq

from ec_connector.adapters.zmq_control.events import decode_event
from ec_connector.domain.transfers import EventKind
from tests.chat_requests import free_port, png

from .openai_server import running_server, server_command, server_env
from .test_local_tier_engine import region_files
from .test_metrics_engine import SIZES, chat, scrape

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REQUESTS = 4  # distinct images, so every request stores an entry on the rank that serves it


def test_each_data_parallel_rank_of_a_dense_producer_has_its_own_tier(vllm_python, tiny_vlm_dir, tmp_path):
    engine_id = f"it-dp-{uuid.uuid4().hex[:6]}"
    feed = f"ipc://{tmp_path}/feed"
    config = {
        "ec_connector": "ECTierConnector",
        "ec_connector_module_path": "ec_connector.entrypoints.vllm",
        "ec_role": "ec_producer",
        "engine_id": engine_id,
        "ec_connector_extra_config": {
            "ec_cpu_bytes": 1 << 20,
            "ec_enable_nixl": True,
            "event_feed_address": feed,
        },
    }
    port = free_port()
    # each rank's side channel on any free port
    env = server_env(VLLM_EC_SIDE_CHANNEL_HOST="127.0.0.1", VLLM_EC_SIDE_CHANNEL_PORT="0")
    cmd = server_command(vllm_python, tiny_vlm_dir, port, config, "--data-parallel-size", "2")
    log = tmp_path / "server.log"
    ctx = zmq.Context()
    subs = []
    for address in (feed, f"{feed}_dp1"):
        sub = ctx.socket(zmq.SUB)
        sub.connect(address)
        sub.setsockopt(zmq.SUBSCRIBE, b"ec.")
        subs.append(sub)
    try:
        with running_server(cmd, env, log, port):
            text = log.read_text()
            regions = sorted(set(re.findall(rf"path=\S*(vllm_ec_{engine_id}_dp\d)\.mmap", text)))
            agents = sorted(set(re.findall(rf"event=nixl_agent_started agent=({engine_id}_dp\d)", text)))
            ports = set(re.findall(r"event=control_server_started host=127\.0\.0\.1 port=(\d+)", text))
            feeds = sorted(set(re.findall(r"event=event_feed_bound address=(\S+)", text)))
            assert regions == [f"vllm_ec_{engine_id}_dp0", f"vllm_ec_{engine_id}_dp1"], regions
            assert agents == [f"{engine_id}_dp0", f"{engine_id}_dp1"], agents
            assert len(ports) == 2, ports
            assert feeds == [feed, f"{feed}_dp1"], feeds
            time.sleep(0.5)  # the SUB sockets connected before the ranks bound; let them join
            answers = [chat(port, png(100 + i, SIZES[i % len(SIZES)])) for i in range(REQUESTS)]
            assert all(a["choices"][0]["message"]["content"] is not None for a in answers)
            stored = []
            for sub in subs:
                while sub.poll(2000):
                    event = decode_event(sub.recv_multipart())
                    if event.kind is EventKind.STORED:
                        stored.append(event.mm_hash)
            assert len(set(stored)) == REQUESTS, (
                stored
            )  # each request's image stored on the rank that served it
            # /metrics: one series per rank (vLLM's `engine` label), the saves adding up to the requests
            metrics = scrape(port)
            saves = {
                dict(ls)["engine"]: v for (n, ls), v in metrics.items() if n == "vllm:ec_tier_saves_total"
            }
            assert sorted(saves) == ["0", "1"] and sum(saves.values()) == REQUESTS, saves
    finally:
        for sub in subs:
            sub.close(linger=0)
        ctx.term()
    assert region_files(engine_id) == []
    # vLLM's own DP shutdown force-kills its engine cores and logs an EngineDeadError traceback; no
    # traceback may pass through our code, and none of our log lines may be an error
    text = log.read_text()
    assert not re.search(r'File "[^"]*/ec_connector/', text)
    assert "level=error" not in text
