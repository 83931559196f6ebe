"""The /dev/shm region adapter across real processes: bytes and completions cross them, the name goes
once all participants joined, and processes racing to create share one file removed exactly once."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ec_connector.adapters.shm import region_file_name
from ec_connector.domain.transfers import Completion
from tests.contract.shm_region_helpers import LAYOUT, child_result, fork_child, instance_name, open_region

REPO = Path(__file__).resolve().parents[2]
LAYOUT_ARGS = {"hidden_dim": 64, "dtype": "float16", "num_blocks": 96}


# -- processes --------------------------------------------------------------------------------

_CHILD = r"""
import json, os, sys, time
from ec_connector.adapters.shm import ShmRegion
from ec_connector.domain.errors import RegionError
from ec_connector.domain.layout import Layout
from ec_connector.domain.transfers import Completion

def reply(**out):
    print("@@" + json.dumps(out), flush=True)

region = None
for line in sys.stdin:
    cmd = json.loads(line)
    op = cmd.pop("op")
    try:
        if op == "open":
            cmd["layout"] = Layout(**cmd["layout"])
            region = ShmRegion.open(**cmd)
            reply(pid=os.getpid(), removed_name=region.removed_name)
        elif op == "write":
            data = bytes.fromhex(cmd["hex"])
            view = region.data()
            view[cmd["offset"] : cmd["offset"] + len(data)] = data
            view.release()
            reply()
        elif op == "read":
            view = region.data()
            reply(hex=bytes(view[cmd["offset"] : cmd["offset"] + cmd["length"]]).hex())
            view.release()
        elif op == "post":
            full = 0
            for n in range(cmd["first"], cmd["first"] + cmd["count"]):
                while not region.post_completions(cmd["rank"], [n], ok=n % 7 != 0):
                    full += 1  # the ring is full until the reader drains it
                    time.sleep(0.0002)
            reply(full=full)
        elif op == "close":
            region.close()
            reply(removed_name=region.removed_name)
    except Exception as err:
        reply(error=type(err).__name__, message=str(err))
"""


class Child:
    """A separate Python interpreter that opens a region and runs commands sent as JSON lines."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        self._replies: queue.Queue[dict[str, object]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@@"):
                self._replies.put(json.loads(line[2:]))

    def send(self, op: str, **kw: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float = 30.0) -> dict[str, object]:
        out = self._replies.get(timeout=timeout)
        assert "error" not in out, out
        return out

    def call(self, op: str, **kw: object) -> dict[str, object]:
        self.send(op, **kw)
        return self.recv()

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def children() -> Iterator[Callable[[], Child]]:
    made: list[Child] = []

    def spawn() -> Child:
        made.append(Child())
        return made[-1]

    yield spawn
    for child in made:
        child.stop()


# -- several processes ------------------------------------------------------------------------


def test_bytes_and_completions_cross_processes_and_the_name_goes_once_all_joined(
    shm_dir: Path, children: Callable[[], Child]
) -> None:
    instance = instance_name()
    path = shm_dir / region_file_name(instance, 0)
    common = {
        "instance": instance,
        "dp_rank": 0,
        "layout": LAYOUT_ARGS,
        "participants": 3,
        "ranks": 2,
        "shm_dir": str(shm_dir),
    }
    rank0, rank1 = children(), children()
    opened0 = rank0.call("open", slot=1, **common)
    assert path.exists()
    opened1 = rank1.call("open", slot=2, **common)
    assert path.exists(), "the name must stay until the third participant joins"

    block = LAYOUT.block_size_bytes
    pattern = os.urandom(3 * block)
    rank0.call("write", offset=7 * block, hex=pattern.hex())
    assert bytes.fromhex(str(rank1.call("read", offset=7 * block, length=len(pattern))["hex"])) == pattern

    with open_region(instance, shm_dir, participants=3, ranks=2, slot=0) as scheduler:
        assert not path.exists()
        removed = [opened0["removed_name"], opened1["removed_name"], scheduler.removed_name]
        assert removed == [False, False, True]
        assert sorted(scheduler.joined_pids()) == sorted([os.getpid(), opened0["pid"], opened1["pid"]])
        view = scheduler.data()
        assert bytes(view[7 * block : 10 * block]) == pattern
        view.release()

        rank0.call("post", rank=0, first=1, count=300)
        rank1.call("post", rank=1, first=1000, count=200)
        drained = scheduler.drain_completions()
        assert [c for c in drained if c.rank == 0] == [Completion(0, n, n % 7 != 0) for n in range(1, 301)]
        assert [c for c in drained if c.rank == 1] == [
            Completion(1, n, n % 7 != 0) for n in range(1000, 1200)
        ]
        assert scheduler.drain_completions() == []

        # a worker posting 5× the ring's capacity while the scheduler drains: each once, in order
        total = 5 * scheduler.geometry.ring_slots
        rank1.send("post", rank=1, first=1, count=total)
        got: list[Completion] = []
        deadline = time.monotonic() + 30
        while len(got) < total and time.monotonic() < deadline:
            got.extend(scheduler.drain_completions())
        assert got == [Completion(1, n, n % 7 != 0) for n in range(1, total + 1)]
        rank1.recv()

        assert rank0.call("close")["removed_name"] is False
        assert rank1.call("close")["removed_name"] is False
    assert list(shm_dir.iterdir()) == []


def test_n_processes_racing_to_create_share_one_file_removed_exactly_once(shm_dir: Path) -> None:
    n = 6
    for _ in range(8):
        instance = instance_name()
        path = shm_dir / region_file_name(instance, 0)
        go_r, go_w = os.pipe()
        hold_r, hold_w = os.pipe()
        procs = []
        for slot in range(n):

            def body(slot: int = slot, instance: str = instance) -> str:
                region = open_region(instance, shm_dir, participants=n, slot=slot, ranks=2)
                region.data()[slot] = slot + 1
                return json.dumps({"removed": region.removed_name, "creator": region.creator_pid})

            procs.append(fork_child(body, go=go_r, hold=hold_r, close=(go_w, hold_w)))
        os.write(go_w, b"g" * n)  # release them together so they race to create
        results = [json.loads(child_result(r)) for _, r in procs]
        assert sum(res["removed"] for res in results) == 1
        assert len({res["creator"] for res in results}) == 1, "two processes created the region"
        assert not path.exists()
        os.close(hold_w)  # let them close and exit
        for pid, _ in procs:
            assert os.waitpid(pid, 0)[1] == 0
        for fd in (go_r, go_w, hold_r):
            os.close(fd)
    assert list(shm_dir.iterdir()) == []
