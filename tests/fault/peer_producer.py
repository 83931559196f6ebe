"""A producer engine's P2P side, in its own process, driven over stdin/stdout (JSON lines).

Built by the composition root exactly as the vLLM facade builds an `ec_producer` scheduler with
NIXL on: a real /dev/shm region, the CPU torch copier and a worker writing into it, the tier
scheduler, a NIXL agent (progress thread on) and the ZMQ ROUTER answering with the producer desk.
Run under `ip netns exec` for the two-host tests. Commands (one JSON object a line; each reply is
one line starting with "@@ "):

    {"op": "store", "key": k, "rows": n}   plan, encode (deterministic bytes), save, wait until READY
    {"op": "reserve", "key": k, "rows": n} plan only: the entry stays NOT_READY (save in flight)
    {"op": "land", "key": k}               the held save lands
    {"op": "step", "keys": [...], "rows": n, "fail": [...]}  one step saving keys; those in fail fail
    {"op": "publish", "keys": [...]}       ec_transfer_params for those items (announces them)
    {"op": "poll"}                         settle deadlines (as an engine step would)
    {"op": "state"}                        entries, pins, grants, free blocks, server counters
    {"op": "stop"}                         shut down (region unlinked, agent closed)

    python tests/fault/peer_producer.py NAME HOST PORT SHM_DIR CPU_BYTES EXTRA_JSON [SECRET]
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import TextIO

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from ec_connector.adapters.zmq_control import ZmqControlServer  # noqa: E402
from ec_connector.container import build_container  # noqa: E402

HIDDEN = 64
DTYPE = "bfloat16"
FINGERPRINT = "fault-suite-fingerprint"
META = {"image_grid_thw": [1, 4, 4]}


def payload(key: str, rows: int) -> bytes:
    """The encoder output every test expects for item `key` (both ends compute it)."""
    return hashlib.shake_256(key.encode()).digest(rows * HIDDEN * 2)


_replies: TextIO | None = None


def reply(body: object) -> None:
    """One reply line on the process's original stdout, which carries nothing else (see main)."""
    reply_channel_setup()
    assert _replies is not None
    _replies.write("@@ " + json.dumps(body) + "\n")
    _replies.flush()


class Producer:
    def __init__(self, name: str, host: str, port: int, shm_dir: str, cpu_bytes: int, extra: dict) -> None:
        self.container = build_container(
            role="ec_producer",
            extra={"ec_cpu_bytes": cpu_bytes, "ec_enable_nixl": True, **extra},
            instance=name,
            hidden_dim=HIDDEN,
            dtype=DTYPE,
            participants=1,
            slot=0,
            tier="shm",
            device="cpu",
            shm_dir=shm_dir,
            fingerprint=FINGERPRINT,
            side_host=host,
            side_port=port,
        )
        self.scheduler = self.container.tier_scheduler()
        self.worker = self.container.tier_worker()
        self.desk = self.container.producer_desk()
        server = self.container.control_server()
        assert isinstance(server, ZmqControlServer)  # its counters go into "state"
        self.server = server
        self.server.start(self.desk.answer, self.desk.done)
        self.held: dict[str, object] = {}

    def _save(self, plan, keys: list[str]) -> None:
        self.worker.bind(plan)
        cache: dict[str, torch.Tensor] = {}
        for copy in plan.saves:
            if copy.key in keys:
                raw = bytearray(payload(copy.key, copy.rows))
                cache[copy.key] = (
                    torch.frombuffer(raw, dtype=torch.uint8).view(torch.bfloat16).view(copy.rows, HIDDEN)
                )
                self.worker.save(cache, copy.key)
        self.worker.clear()  # planned saves that never came are reported failed

    def _settle(self, keys: list[str], bound_s: float = 10.0) -> None:
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            self.scheduler.poll()
            if all(self.scheduler.is_ready(k) or not self.scheduler.holds(k) for k in keys):
                return
            time.sleep(0.002)

    def store(self, key: str, rows: int) -> dict:
        self.scheduler.on_allocated(key, rows)
        plan = self.scheduler.take_plan()
        self._save(plan, [key])
        self._settle([key])
        return {"stored": self.scheduler.is_ready(key)}

    def reserve(self, key: str, rows: int) -> dict:
        self.scheduler.on_allocated(key, rows)
        self.held[key] = self.scheduler.take_plan()
        return {"reserved": self.scheduler.holds(key)}

    def land(self, key: str) -> dict:
        self._save(self.held.pop(key), [key])
        self._settle([key])
        return {"stored": self.scheduler.is_ready(key)}

    def step(self, keys: list[str], rows: int, fail: list[str]) -> dict:
        """One engine step that plans saves of every key (in order); those in `fail` fail."""
        for key in keys:
            self.scheduler.on_allocated(key, rows)
        failing = set(fail)
        kept = [k for k in keys if k not in failing]
        self._save(self.scheduler.take_plan(), kept)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self.scheduler.poll()
            tier = self.scheduler
            if all(not tier.holds(k) for k in failing) and all(tier.is_ready(k) for k in kept):
                break
            time.sleep(0.002)
        return {"ready": sum(self.scheduler.is_ready(k) for k in keys)}

    def state(self) -> dict:
        entries, occupancy = self.scheduler.entries(), self.scheduler.occupancy()
        return {
            "entries": {e.key: e.phase.value for e in entries},
            "pinned": sum(e.is_pinned for e in entries),
            "grants": sum(len(e.grants) for e in entries),
            "free_blocks": occupancy.free_blocks,
            "runs": {e.key: len(e.extents) for e in entries if len(e.extents) > 1},
            "num_blocks": occupancy.free_blocks + occupancy.used_blocks,
            "dropped": dict(self.server.dropped),
            "answered": self.server.answered,
            "done": self.server.done,
            "callback_errors": self.server.callback_errors,
            "peer": self.desk.stats.as_dict(),
        }

    def handle(self, cmd: dict) -> dict:
        op = cmd["op"]
        if op == "store":
            return self.store(cmd["key"], cmd["rows"])
        if op == "reserve":
            return self.reserve(cmd["key"], cmd["rows"])
        if op == "land":
            return self.land(cmd["key"])
        if op == "step":
            return self.step(cmd["keys"], cmd["rows"], cmd.get("fail", []))
        if op == "publish":
            return self.desk.publish({k: META for k in cmd["keys"]})
        if op == "poll":
            self.scheduler.poll()
            return {}
        if op == "state":
            return self.state()
        raise ValueError(f"unknown op {op!r}")

    def stop(self) -> None:
        self.worker.close()
        self.container.shutdown_resources()


def reply_channel_setup() -> None:
    """Log lines (ours, NIXL's, UCX's, from any thread) would interleave with replies on a shared
    stdout: keep the original stdout for replies only and send fd 1 to stderr."""
    global _replies
    if _replies is None:
        _replies = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)


def main() -> None:
    reply_channel_setup()
    name, host, port, shm_dir, cpu_bytes, extra = sys.argv[1:7]
    extra_config = json.loads(extra)
    if len(sys.argv) > 7:
        extra_config["side_channel_secret"] = sys.argv[7]
    producer = Producer(name, host, int(port), shm_dir, int(cpu_bytes), extra_config)
    reply(
        {
            "port": producer.server.address.port,
            "agent": producer.container.agent_name(),
            "num_blocks": producer.scheduler.layout.num_blocks,
        }
    )
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "stop":
            producer.stop()
            reply({"stopped": True})
            return
        try:
            reply({"ok": producer.handle(cmd)})
        except Exception as err:  # the test sees the error instead of a hang
            reply({"error": f"{type(err).__name__}: {err}"})


if __name__ == "__main__":
    main()
