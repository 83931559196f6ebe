"""Two hosts on one machine: producer and consumer processes in two network namespaces joined by
a veth pair, the side channel and NIXL (UCX over TCP, on the veth device only) crossing it.

Checks: a transfer across works byte-exact; the link taken down while a READ is in flight ends
in fallback within the timeouts; once the link is back, transfers resume. Needs root (`ip netns`);
skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import CONSUMER_EXTRA, HAVE_NIXL, NO_NIXL, PYTHON, DrivenProcess, ProducerProcess

pytestmark = [pytest.mark.skipif(not HAVE_NIXL, reason=NO_NIXL), pytest.mark.fault_long]

PRODUCER_IP, CONSUMER_IP = "10.231.7.1", "10.231.7.2"
READ_BOUND = CONSUMER_EXTRA["consumer_ack_timeout_s"] + CONSUMER_EXTRA["read_timeout_s"]
HEARTBEAT_LOSS_S = 4.0 + 2.0  # ZMQ heartbeat timeout + interval: a cut link is noticed by then


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def two_hosts() -> Iterator[dict[str, str]]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    if shutil.which("ip") is None:
        pytest.skip("the ip command (iproute2) is not installed")
    tag = uuid.uuid4().hex[:5]
    hosts = {"producer": f"ecp{tag}", "consumer": f"ecc{tag}", "pveth": f"vp{tag}", "cveth": f"vc{tag}"}
    try:
        ip("netns", "add", hosts["producer"])
    except subprocess.CalledProcessError as err:
        pytest.skip(f"ip netns add failed: {err.stderr.strip()}")
    try:
        ip("netns", "add", hosts["consumer"])
        ip("link", "add", hosts["pveth"], "type", "veth", "peer", "name", hosts["cveth"])
        for side, veth, addr in (("producer", "pveth", PRODUCER_IP), ("consumer", "cveth", CONSUMER_IP)):
            ns, dev = hosts[side], hosts[veth]
            ip("link", "set", dev, "netns", ns)
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield hosts
    finally:
        for ns in (hosts["producer"], hosts["consumer"]):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # removes the veth pair too


class ConsumerProcess(DrivenProcess):
    def __init__(self, shm_dir: Path, netns: str, env: dict[str, str]) -> None:
        script = Path(__file__).with_name("peer_consumer.py")
        argv = ["ip", "netns", "exec", netns, PYTHON, str(script), str(shm_dir), json.dumps({})]
        super().__init__(f"consumer@{netns}", argv, env)


def test_transfers_cross_the_veth_pair_fall_back_when_the_link_drops_and_resume_after(
    two_hosts: dict[str, str], shm_dir: Path
) -> None:
    producer = ProducerProcess(
        "prod-netns",
        shm_dir,
        host=PRODUCER_IP,
        port=5601,
        cpu_bytes=1024 * 128,
        extra={"producer_pin_lease_s": 3.0},
        prefix=("ip", "netns", "exec", two_hosts["producer"]),
        env={"UCX_TLS": "tcp", "UCX_NET_DEVICES": two_hosts["pveth"]},
    )
    consumer = ConsumerProcess(
        shm_dir, two_hosts["consumer"], env={"UCX_TLS": "tcp", "UCX_NET_DEVICES": two_hosts["cveth"]}
    )
    try:
        # 1. across the link: the params carry the producer's veth address; bytes verified
        params = producer.store("first", 128)
        assert params["first"]["peer_host"] == PRODUCER_IP
        got = consumer.call("fetch", params=params, items=[["first", 128]], bound_s=READ_BOUND)
        assert got["outcome"] == {"first": "read"}, got
        assert consumer.call("verify", key="first", rows=128) == {"equal": True}

        # 2. the link goes down after the ack, before the READ is posted: fallback within bounds
        down = f"ip link set {two_hosts['cveth']} down"
        params = producer.store("second", 128)
        got = consumer.call("fetch", params=params, items=[["second", 128]], bound_s=READ_BOUND, on_ok=down)
        print("link down after the ack:", got["outcome"], f"{got['seconds']:.2f} s")
        assert got["fired"] and got["outcome"] == {"second": "fallback"}, got
        assert got["stats"]["read_timeouts"] + got["stats"]["reads_failed"] == 1, got["stats"]
        consumer.call("clean")  # the quarantine ends; nothing pinned or lost

        # 3. while it is down, a new item cannot be asked for: ack timeout (or peer lost) -> fallback
        params = producer.store("third", 16)
        got = consumer.call("fetch", params=params, items=[["third", 16]], bound_s=HEARTBEAT_LOSS_S)
        print("link down, new request:", got["outcome"], f"{got['seconds']:.2f} s")
        assert got["outcome"] == {"third": "fallback"}, got

        # 4. link back up: transfers resume, byte-exact
        ip("-n", two_hosts["consumer"], "link", "set", two_hosts["cveth"], "up")
        params = producer.store("fourth", 128)
        got = consumer.call("fetch", params=params, items=[["fourth", 128]], bound_s=READ_BOUND + 10)
        print("link back up:", got["outcome"], f"{got['seconds']:.2f} s")
        assert got["outcome"] == {"fourth": "read"}, got
        assert consumer.call("verify", key="fourth", rows=128) == {"equal": True}
        consumer.call("clean")
        # the XferDone of step 2 was lost with the link: the producer's grant lease releases it
        time.sleep(3.0)
        producer.call("poll")
        state = producer.state()
        assert state["pinned"] == 0 and state["grants"] == 0, state
        assert state["callback_errors"] == 0
    finally:
        consumer.stop()
        producer.stop()
