"""Fault-injection harness: a real producer process and a real consumer in this process.

`ProducerProcess` runs tests/fault/peer_producer.py (composition root, /dev/shm region, CPU torch
copier, NIXL agent, ZMQ ROUTER + producer desk) and drives it over a pipe; it can be stopped,
continued and killed with signals. `ConsumerSide` is the consumer engine's P2P side built from the
real adapters: a /dev/shm `ShmRegion`, the tier scheduler, a `ZmqControlClient`, a
`NixlPeerTransport` (progress thread off, as the contract suite's consumer: it progresses by
polling, which the fetcher does every step; this keeps the 2-core CI machine free) and the
`ConsumerFetcher`.

The fault suite (its fixtures are in conftest.py), tests/fault/peer_consumer.py and bench/soak.py
use them; nothing here needs pytest.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ec_connector.adapters.shm import ShmRegion
from ec_connector.adapters.system import LogEventSink, SystemClock
from ec_connector.adapters.zmq_control import Heartbeat, ZmqControlClient
from ec_connector.application import TierScheduler
from ec_connector.application.consumer import ConsumerFetcher, WantedItem
from ec_connector.application.stats import PeerStats
from ec_connector.container import parse_settings
from ec_connector.domain.entries import Phase
from ec_connector.domain.layout import Layout

from .peer_producer import FINGERPRINT, HIDDEN, payload

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("peer_producer.py")
PYTHON = sys.executable
ROW_BYTES = HIDDEN * 2

# Consumer bounds used by the suite (the documented defaults scaled down so a run stays short).
CONSUMER_EXTRA: dict[str, Any] = {
    "consumer_ack_timeout_s": 1.0,
    "read_timeout_s": 2.0,
    "quarantine_s": 0.5,
    "not_ready_backoff_s": 0.05,
    "not_ready_backoff_max_s": 0.4,
    "not_ready_give_up_s": 1.5,
    "nixl_consumer_progress_thread": False,  # spares a core on the 2-core CI machine
}
SLACK_S = 2.0  # scheduling slack on a loaded 2-core machine, added to every bound
HAVE_NIXL = importlib.util.find_spec("nixl") is not None
NO_NIXL = "nixl is not installed: pip install --no-deps -r requirements/p2p.txt"


class DrivenProcess:
    """A child process driven over its stdin/stdout (JSON lines, replies prefixed "@@ ")."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.hello = self._read(120)

    def _read(self, timeout_s: float = 30.0) -> dict:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"process {self.name} exited with {self.proc.wait(10)}")
            if line.startswith("@@ "):
                return json.loads(line[3:])
        raise AssertionError(f"process {self.name} did not answer within {timeout_s} s")

    def call(self, op: str, **args: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        got = self._read()
        assert "error" not in got, got["error"]
        return got["ok"]

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> None:
        """Shut down cleanly (region unlinked, agent closed); kill if it does not answer."""
        try:
            if self.proc.poll() is not None:
                return
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": "stop"}) + "\n")
            self.proc.stdin.flush()
            self._read(30)
            self.proc.wait(30)
        except (AssertionError, OSError, subprocess.TimeoutExpired):
            self.kill()
        finally:
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream is not None:
                    stream.close()


class ProducerProcess(DrivenProcess):
    """tests/fault/peer_producer.py in a child process (optionally under a command prefix)."""

    def __init__(
        self,
        name: str,
        shm_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        cpu_bytes: int = 256 * ROW_BYTES,
        extra: dict[str, Any] | None = None,
        secret: str | None = None,
        prefix: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.host = host
        # No port given: the producer binds port 0 and says which it got (a port picked here could
        # be taken by another process's socket before the child binds it). A restart passes the
        # port the first process had, so consumers reach it at the same address.
        argv = [*prefix, PYTHON, str(SCRIPT), name, host, str(port or 0), str(shm_dir), str(cpu_bytes)]
        argv.append(json.dumps(extra or {}))
        if secret is not None:
            argv.append(secret)
        super().__init__(name, argv, env)
        self.agent = self.hello["agent"]
        self.port: int = self.hello["port"]
        assert port in (None, self.port), f"producer asked for port {port} listens on {self.port}"

    def store(self, key: str, rows: int) -> dict:
        assert self.call("store", key=key, rows=rows)["stored"], f"{key} was not stored"
        return self.call("publish", keys=[key])

    def state(self) -> dict:
        return self.call("state")


class ConsumerSide:
    """The consumer engine's P2P side over the real adapters, in this process."""

    def __init__(
        self,
        shm_dir: Path,
        *,
        blocks: int = 256,
        extra: dict[str, Any] | None = None,
        fingerprint: str = FINGERPRINT,
        ucx_error_mode: str = "none",
        heartbeat: Heartbeat | None = None,
    ) -> None:
        from ec_connector.adapters.nixl_data import open_lanes

        self.name = f"cons-{uuid.uuid4().hex[:6]}"
        extra = {**CONSUMER_EXTRA, "ucx_error_mode": ucx_error_mode, **(extra or {})}
        settings = parse_settings(
            {"ec_cpu_bytes": blocks * ROW_BYTES, "ec_enable_nixl": True, **extra}, role="ec_consumer"
        )
        self.config = settings.tier
        layout = Layout.for_budget(self.config.cpu_bytes, hidden_dim=HIDDEN, dtype="bfloat16")
        self.region = ShmRegion.open(instance=self.name, dp_rank=0, layout=layout, shm_dir=shm_dir)
        self.scheduler = TierScheduler(
            config=self.config,
            region=self.region,
            clock=SystemClock(),
            events=LogEventSink(),
            ranks=1,
            engine_id=self.name,
        )
        self.control = ZmqControlClient(
            secret=settings.zmq.side_channel_secret, heartbeat=heartbeat or Heartbeat()
        )
        self.transport = open_lanes(  # as the container builds it: READs cut across the lanes
            self.region,
            agent_name=f"{self.name}_dp0",
            lanes=settings.nixl.read_lanes,
            backend=settings.nixl.backend,
            ucx_error_mode=settings.nixl.ucx_error_mode,
            progress_thread=settings.nixl.consumer_progress_thread,
        )
        self.stats = PeerStats()
        self.fetcher = ConsumerFetcher(
            tier=self.scheduler,
            config=self.config,
            clock=SystemClock(),
            control=self.control,
            transport=self.transport,
            fingerprint=fingerprint,
            engine_id=self.name,
            stats=self.stats,
        )
        self._requests = 0
        self.closed = False

    def step(self, params: dict, items: list[tuple[str, int]], request_id: str, media: bool = True) -> bool:
        """One engine step for one request: poll, ensure_cache_available, then the step's plan
        (vLLM calls build_connector_meta every step; it settles the tier's deadlines)."""
        self.fetcher.poll()
        wanted = [WantedItem(key, rows, media) for key, rows in items]
        available = self.fetcher.ensure_available(request_id, params, wanted)
        self.scheduler.take_plan()
        return available

    def fetch(
        self,
        params: dict,
        items: list[tuple[str, int]],
        *,
        bound_s: float,
        media: bool = True,
        on_step: Callable[[ConsumerSide], None] | None = None,
    ) -> dict[str, str]:
        """Step until the request is no longer deferred; each item's outcome: read / fallback.

        Fails if the request is still deferred after `bound_s` (plus slack): a request is never
        blocked forever.
        """
        self._requests += 1
        rid = f"req-{self._requests}"
        deadline = time.monotonic() + bound_s + SLACK_S
        while not self.step(params, items, rid, media):
            if on_step is not None:
                on_step(self)
            assert time.monotonic() < deadline, f"request still deferred after {bound_s} s + slack"
            time.sleep(0.002)
        return {key: ("read" if self.scheduler.is_ready(key) else "fallback") for key, _ in items}

    def local_bytes(self, key: str) -> bytes:
        entry = self.scheduler.entry(key)
        assert entry is not None and entry.is_ready
        view = self.region.data()
        b = self.region.layout.block_size_bytes
        try:
            return b"".join(bytes(view[e.start * b : e.end * b]) for e in entry.extents)
        finally:
            view.release()

    def assert_read(self, key: str, rows: int) -> None:
        assert self.local_bytes(key) == payload(key, rows), f"bytes of {key} differ from the producer's"

    def settle(self, bound_s: float | None = None) -> None:
        """Let quarantines end and deadlines pass; then nothing may be in flight or pinned."""
        deadline = time.monotonic() + (bound_s if bound_s is not None else self.config.quarantine_s + SLACK_S)
        while True:
            self.fetcher.poll()
            self.scheduler.poll()
            busy = [e for e in self.scheduler.entries() if e.phase is not Phase.READY]
            if not busy and not self.fetcher.has_pending_work():
                return
            assert time.monotonic() < deadline, f"still busy: {[(e.key, e.phase) for e in busy]}"
            time.sleep(0.01)

    def assert_clean(self) -> None:
        """No pin, no transfer in flight, every block free or held by a READY entry."""
        self.settle()
        entries = self.scheduler.entries()
        assert [e.key for e in entries if e.is_pinned] == []
        assert all(e.phase is Phase.READY for e in entries)
        held = sum(e.rows for e in entries)
        assert self.scheduler.occupancy().used_blocks == held
        for entry in entries:
            assert self.scheduler.evict(entry.key), f"{entry.key} is still held"
        assert self.scheduler.occupancy().used_blocks == 0
        assert not self.fetcher.has_pending_work()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.control.close()
        self.transport.close()
        self.region.close()


def resources() -> tuple[int, int]:
    """(open file descriptors, OS threads) of this process."""
    return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))


def open_fds() -> list[str]:
    out = []
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        with contextlib.suppress(OSError):
            out.append(f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}")
    return out
