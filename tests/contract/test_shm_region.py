"""The /dev/shm region adapter beyond the port contract: naming, several real processes, crash
safety (SIGKILL cycles, orphan reaping) and refusal of bad input without touching the file."""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ec_connector.adapters.shm import (
    REGION_GLOB,
    BadRegionName,
    ShmRegion,
    list_regions,
    reap_orphans,
    region_file_name,
    remove,
)
from ec_connector.domain.errors import RegionError
from ec_connector.domain.layout import Layout
from ec_connector.domain.transfers import Completion

REPO = Path(__file__).resolve().parents[2]
LAYOUT = Layout(hidden_dim=64, dtype="float16", num_blocks=96)
LAYOUT_ARGS = {"hidden_dim": 64, "dtype": "float16", "num_blocks": 96}
ROOT = os.geteuid() == 0


def _instance() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def _snapshot(path: Path) -> tuple[object, ...]:
    st = os.lstat(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode, st.st_uid, digest)


def _dir_snapshot(directory: Path) -> dict[str, tuple[object, ...]]:
    return {p.name: _snapshot(p) for p in directory.iterdir()}


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


def _fork(
    body: Callable[[], str], *, go: int | None = None, hold: int | None = None, close: tuple[int, ...] = ()
) -> tuple[int, int]:
    """Fork a child that (after a byte on `go`) runs `body`, reports its result on the returned
    pipe, then stays alive holding what it opened until `hold` reaches EOF (or forever). The child
    closes `close` first: the parent's ends of those pipes must not stay open in it."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            os.close(r)
            for fd in close:
                os.close(fd)
            if go is not None:
                os.read(go, 1)
            os.write(w, ("ok " + body()).encode())
            if hold is None:
                while True:
                    time.sleep(60)
            os.read(hold, 1)
        except BaseException as err:
            os.write(w, f"err {type(err).__name__}: {err}".encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def _result(r: int) -> str:
    out = os.read(r, 4096).decode()
    os.close(r)
    assert out.startswith("ok "), out
    return out[3:]


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _open(instance: str, shm_dir: Path, **kw: object) -> ShmRegion:
    args: dict[str, object] = {"dp_rank": 0, "layout": LAYOUT, "shm_dir": shm_dir, **kw}
    return ShmRegion.open(instance=instance, **args)  # type: ignore[arg-type]


# -- naming -----------------------------------------------------------------------------------


def test_region_file_is_dev_shm_vllm_ec_instance_dp_rank_mmap_mode_0600() -> None:
    instance = _instance()
    with ShmRegion.open(instance=instance, dp_rank=3, layout=LAYOUT, participants=2) as region:
        path = Path(f"/dev/shm/vllm_ec_{instance}_dp3.mmap")
        assert region.path == path and region.name == path.name
        st = os.stat(path)
        assert oct(st.st_mode & 0o777) == oct(0o600) and st.st_uid == os.getuid()
        assert st.st_size == region.geometry.file_size == region.geometry.data_offset + LAYOUT.data_bytes
        assert region.geometry.data_offset % 4096 == 0
        assert not list(Path("/dev/shm").glob(f".vllm_ec_{instance}*")), "staging file left"
    assert not path.exists()


def test_header_is_accounted_openly() -> None:
    with ShmRegion.open(instance=_instance(), dp_rank=0, layout=LAYOUT, ranks=1) as one:
        assert one.geometry.data_offset == 40 * 1024
    with ShmRegion.open(instance=_instance(), dp_rank=0, layout=LAYOUT, ranks=8) as eight:
        assert eight.geometry.data_offset == 264 * 1024


BAD_INSTANCES = [
    "",
    ".",
    "..",
    ".hidden",
    "a/b",
    "../x",
    "/abs",
    "a\\b",
    "a b",
    "a\0b",
    "é",
    "x" * 101,
    None,
    7,
]


@pytest.mark.parametrize("instance", BAD_INSTANCES)
def test_bad_instance_names_are_refused_and_touch_nothing(instance: object, shm_dir: Path) -> None:
    sentinel = shm_dir / "vllm_ec_keep_dp0.mmap"
    with _open("keep", shm_dir, participants=2):
        (shm_dir / "other.bin").write_bytes(b"x" * 10)
        before = _dir_snapshot(shm_dir)
        with pytest.raises(BadRegionName) as info:
            ShmRegion.open(instance=instance, dp_rank=0, layout=LAYOUT, shm_dir=shm_dir)  # type: ignore[arg-type]
        assert repr(instance)[:40] in str(info.value) and "[A-Za-z0-9._-]" in str(info.value)
        assert isinstance(info.value, ValueError) and isinstance(info.value, RegionError)
        assert _dir_snapshot(shm_dir) == before
        assert sentinel.exists()
    (shm_dir / "other.bin").unlink()


def test_instance_names_at_the_edges_of_the_accepted_form_work(shm_dir: Path) -> None:
    for instance in ["a", "x" * 100, "engine-0.producer_A", "0", "_x", "-x", "a..b"]:
        with _open(instance, shm_dir) as region:
            assert region.name == f"vllm_ec_{instance}_dp0.mmap"


@pytest.mark.parametrize("dp_rank", [-1, True, "0", 1.5, None])
def test_bad_dp_ranks_are_refused(dp_rank: object) -> None:
    with pytest.raises(BadRegionName, match="dp_rank .*expected an integer >= 0"):
        region_file_name("ok", dp_rank)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"participants": 2, "slot": 2}, "slot 2 is outside 0..1"),
        ({"slot": -1}, "slot -1"),
        ({"participants": 0}, "participants 0"),
        ({"participants": 257}, "participants 257"),
        ({"ranks": 0}, "ranks 0"),
        ({"ring_slots": 0}, "ring_slots 0"),
    ],
)
def test_bad_counts_are_refused_before_any_file_exists(kw: dict[str, int], match: str, shm_dir: Path) -> None:
    with pytest.raises(ValueError, match=match):
        _open(_instance(), shm_dir, **kw)


# -- several processes ------------------------------------------------------------------------


def test_bytes_and_completions_cross_processes_and_the_name_goes_once_all_joined(
    shm_dir: Path, children: Callable[[], Child]
) -> None:
    instance = _instance()
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

    with _open(instance, shm_dir, participants=3, ranks=2, slot=0) as scheduler:
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
        instance = _instance()
        path = shm_dir / region_file_name(instance, 0)
        go_r, go_w = os.pipe()
        hold_r, hold_w = os.pipe()
        procs = []
        for slot in range(n):

            def body(slot: int = slot, instance: str = instance) -> str:
                region = _open(instance, shm_dir, participants=n, slot=slot, ranks=2)
                region.data()[slot] = slot + 1
                return json.dumps({"removed": region.removed_name, "creator": region.creator_pid})

            procs.append(_fork(body, go=go_r, hold=hold_r, close=(go_w, hold_w)))
        os.write(go_w, b"g" * n)  # release them together so they race to create
        results = [json.loads(_result(r)) for _, r in procs]
        assert sum(res["removed"] for res in results) == 1
        assert len({res["creator"] for res in results}) == 1, "two processes created the region"
        assert not path.exists()
        os.close(hold_w)  # let them close and exit
        for pid, _ in procs:
            assert os.waitpid(pid, 0)[1] == 0
        for fd in (go_r, go_w, hold_r):
            os.close(fd)
    assert list(shm_dir.iterdir()) == []


# -- crash safety -----------------------------------------------------------------------------


def test_sigkill_before_all_joined_leaves_an_orphan_the_next_start_removes(shm_dir: Path) -> None:
    instance = _instance()
    path = shm_dir / region_file_name(instance, 0)
    for cycle in range(20):
        pid, r = _fork(lambda: str(_open(instance, shm_dir, participants=2).path))
        assert _result(r) == str(path)
        _kill(pid)
        assert path.exists(), "killed before the second participant joined: the file is still there"
        assert list_regions(shm_dir)[0].orphaned
        if cycle % 2 == 0:  # a restart with the same engine_id starts cleanly
            with _open(instance, shm_dir, participants=2) as region:
                assert region.joined_pids()[0] == os.getpid()
                assert region.creator_pid == os.getpid()
        else:
            assert reap_orphans(shm_dir) == [path]
        assert not path.exists()
    assert list(shm_dir.glob("*vllm_ec_*")) == []


def test_sigkill_at_random_points_of_create_join_close_leaves_nothing_after_reaping(shm_dir: Path) -> None:
    instance = _instance()
    rng = random.Random(1234)
    leftovers: list[str] = []
    for _ in range(10):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            try:
                os.close(r)
                os.write(w, b"s")
                slot = 0
                while True:  # create, join, close, over and over, until killed
                    region = _open(instance, shm_dir, participants=2, slot=slot)
                    region.close()
            finally:
                os._exit(1)
        os.close(w)
        assert os.read(r, 1) == b"s"
        os.close(r)
        time.sleep(rng.uniform(0.01, 0.06))
        _kill(pid)
        left = sorted(p.name for p in shm_dir.iterdir())
        leftovers.extend(left)
        assert sorted(p.name for p in reap_orphans(shm_dir)) == left
        assert list(shm_dir.iterdir()) == []
    print("left behind by the kills, then reaped:", leftovers)


def test_sigkill_after_all_joined_leaves_nothing_at_all(shm_dir: Path) -> None:
    instance = _instance()
    procs = [
        _fork(lambda s=s: str(_open(instance, shm_dir, participants=2, slot=s).removed_name)) for s in (0, 1)
    ]
    assert sorted(_result(r) for _, r in procs) == ["False", "True"]
    for pid, _ in procs:
        _kill(pid)
    assert list(shm_dir.iterdir()) == []
    assert reap_orphans(shm_dir) == []


def test_a_second_instance_on_the_same_host_is_never_touched(shm_dir: Path) -> None:
    mine, live_other, dead_other = _instance(), _instance(), _instance()
    with _open(live_other, shm_dir, participants=2) as other:
        pid, r = _fork(lambda: str(_open(dead_other, shm_dir, participants=2).path))
        orphan = Path(_result(r))
        _kill(pid)
        before = _dir_snapshot(shm_dir)
        for _ in range(3):
            with _open(mine, shm_dir) as region:  # participants=1: created, joined, name removed
                assert region.removed_name
            with _open(mine, shm_dir, participants=2):  # closed before the second joins
                pass
            assert reap_orphans(shm_dir, name=region_file_name(mine, 0)) == []
        assert _dir_snapshot(shm_dir) == before
        assert reap_orphans(shm_dir) == [orphan]
        assert other.path.exists() and _snapshot(other.path) == before[other.path.name]
    assert list(shm_dir.iterdir()) == []


def test_close_removes_the_name_only_when_no_one_else_holds_the_file(shm_dir: Path) -> None:
    instance = _instance()
    first = _open(instance, shm_dir, participants=3, slot=0)
    second = _open(instance, shm_dir, participants=3, slot=1)
    first.close()
    assert second.path.exists() and not first.removed_name
    second.close()
    assert not second.path.exists() and second.removed_name
    second.close()


def test_an_unjoined_forked_copy_closing_does_not_drop_the_owners_lock(shm_dir: Path) -> None:
    region = _open(_instance(), shm_dir, participants=2)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        region.close()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert region.path.exists()
    assert reap_orphans(shm_dir) == [], "the owner is alive: its file is not an orphan"
    region.close()


# -- completions: bad input and back pressure -------------------------------------------------


def test_a_full_ring_records_what_fits_and_never_overwrites(shm_dir: Path) -> None:
    with _open(_instance(), shm_dir, ranks=2, ring_slots=8) as region:
        assert region.post_completions(1, [n + 1 for n in range(6)]) == 6
        assert region.post_completions(1, [7, 8, 9, 10], ok=False) == 2  # the first two fit
        assert region.post_completions(1, [99]) == 0
        assert region.post_completions(0, [5]) == 1  # other ranks are unaffected
        assert region.drain_completions() == [Completion(0, 5)] + [Completion(1, n + 1) for n in range(6)] + [
            Completion(1, 7, ok=False),
            Completion(1, 8, ok=False),
        ]
        assert region.post_completions(1, [9, 10, 100], ok=False) == 3  # the rest, after the drain
        assert region.drain_completions() == [Completion(1, t, ok=False) for t in (9, 10, 100)]


def test_batches_that_wrap_around_the_ring_drain_in_order(shm_dir: Path) -> None:
    with _open(_instance(), shm_dir, ranks=1, ring_slots=8) as region:
        ticket = 1
        for size in (6, 5, 8, 3, 7):  # every batch after the first starts where the last ended
            tickets = list(range(ticket, ticket + size))
            assert region.post_completions(0, tickets, ok=size % 2 == 0) == size
            assert region.drain_completions() == [Completion(0, t, ok=size % 2 == 0) for t in tickets]
            ticket += size


@pytest.mark.parametrize(
    ("completion", "match"),
    [
        (Completion(2, 1), "rank 2 is outside 0..1"),
        (Completion(-1, 1), "rank -1"),
        (Completion(0, 2**62), f"ticket {2**62} is outside"),
        (Completion(0, -1), "ticket -1"),
    ],
)
def test_bad_rank_or_ticket_is_refused_by_name(completion: Completion, match: str, shm_dir: Path) -> None:
    with _open(_instance(), shm_dir, ranks=2) as region:
        with pytest.raises(ValueError, match=match):
            region.post_completions(completion.rank, [1, completion.ticket])
        assert region.drain_completions() == []


# -- data area --------------------------------------------------------------------------------


def test_data_address_is_this_processes_address_of_the_data_area(shm_dir: Path) -> None:
    with _open(_instance(), shm_dir, populate=True) as region:
        view = region.data()
        view[:6] = b"region"
        assert ctypes.string_at(region.data_address(), 6) == b"region"
        ctypes.memmove(region.data_address() + LAYOUT.data_bytes - 3, b"end", 3)
        assert bytes(view[-3:]) == b"end"
        view.release()
    with pytest.raises(RegionError):
        region.data_address()


def test_a_view_kept_past_close_stays_readable_and_close_does_not_raise(shm_dir: Path) -> None:
    region = _open(_instance(), shm_dir)
    view = region.data()
    view[:3] = b"abc"
    region.close()
    with pytest.raises(RegionError):
        region.data()
    assert bytes(view[:3]) == b"abc"  # still mapped until the last view goes
    view.release()


# -- bad files: refused, left exactly as they were --------------------------------------------


@pytest.fixture
def held(shm_dir: Path) -> Iterator[ShmRegion]:
    """A region of 2 participants of which only this one has joined (so its file exists)."""
    region = _open(_instance(), shm_dir, participants=2, ranks=2)
    view = region.data()
    view[:8] = b"original"
    view.release()
    yield region
    region.close()


def _join_held(held: ShmRegion, **kw: object) -> ShmRegion:
    args: dict[str, object] = {"participants": 2, "ranks": 2, "slot": 1, **kw}
    return _open(held.path.name[len("vllm_ec_") : -len("_dp0.mmap")], held.path.parent, **args)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"layout": Layout(hidden_dim=65, dtype="float16", num_blocks=96)}, "hidden_dim"),
        ({"layout": Layout(hidden_dim=64, dtype="bfloat16", num_blocks=96)}, "dtype"),
        ({"layout": Layout(hidden_dim=64, dtype="float16", num_blocks=95)}, "num_blocks"),
        ({"ranks": 3}, "ranks"),
        ({"participants": 3}, "participants"),
        ({"ring_slots": 1024}, "ring_slots"),
    ],
)
def test_a_joiner_with_another_layout_is_refused_naming_the_field(
    held: ShmRegion, kw: dict[str, object], field: str
) -> None:
    before = _snapshot(held.path)
    with pytest.raises(RegionError, match=rf"{held.path}.*{field}: file has"):
        _join_held(held, **kw)
    assert _snapshot(held.path) == before


def test_a_file_of_the_wrong_size_is_refused(held: ShmRegion) -> None:
    os.truncate(held.path, held.geometry.file_size + 4096)
    before = _snapshot(held.path)
    with pytest.raises(RegionError, match=rf"size: file has {held.geometry.file_size + 4096} bytes"):
        _join_held(held)
    assert _snapshot(held.path) == before


def test_a_file_with_another_mode_is_refused(held: ShmRegion) -> None:
    os.chmod(held.path, 0o644)
    before = _snapshot(held.path)
    with pytest.raises(RegionError, match="mode 0o644, expected 0o600"):
        _join_held(held)
    assert _snapshot(held.path) == before


def test_a_slot_already_taken_is_refused(held: ShmRegion) -> None:
    before = _snapshot(held.path)
    with pytest.raises(RegionError, match=f"slot 0 .* already joined by pid {os.getpid()}"):
        _join_held(held, slot=0)
    assert _snapshot(held.path) == before
    with _join_held(held) as second:  # the right slot still joins, and completes the set
        assert second.removed_name


@pytest.mark.skipif(not ROOT, reason="chown to another uid needs root")
def test_a_file_owned_by_another_user_is_refused_and_never_reaped(held: ShmRegion, shm_dir: Path) -> None:
    os.chown(held.path, 65534, 65534)
    before = _snapshot(held.path)
    with pytest.raises(RegionError, match="owned by uid 65534"):
        _join_held(held)
    assert _snapshot(held.path) == before
    foreign = shm_dir / "vllm_ec_foreign_dp0.mmap"
    foreign.write_bytes(os.urandom(8192))
    os.chmod(foreign, 0o600)
    os.chown(foreign, 65534, 65534)
    before = _snapshot(foreign)
    assert reap_orphans(shm_dir) == []
    with pytest.raises(RegionError, match="owned by uid 65534"):
        _open("foreign", shm_dir)
    assert _snapshot(foreign) == before
    with pytest.raises(RegionError, match="owned by uid 65534"):
        remove(foreign)
    assert remove(foreign, force=True)


def test_a_held_file_that_is_not_a_region_is_refused_and_an_unheld_one_is_replaced(shm_dir: Path) -> None:
    path = shm_dir / region_file_name("junk", 0)
    path.write_bytes(os.urandom(LAYOUT.data_bytes + 65536))
    os.chmod(path, 0o600)
    before = _snapshot(path)
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # some live process holds it
    try:
        with pytest.raises(RegionError, match="not start with a region header"):
            _open("junk", shm_dir)
        assert _snapshot(path) == before
    finally:
        os.close(fd)
    with _open("junk", shm_dir, participants=2) as region:  # nobody holds it: reaped, recreated
        assert os.stat(path).st_ino != before[0] or _snapshot(path) != before
        assert region.path == path


def test_a_symlink_at_the_name_is_refused_and_its_target_untouched(shm_dir: Path) -> None:
    target = shm_dir / "target.bin"
    target.write_bytes(b"precious")
    link = shm_dir / region_file_name("sym", 0)
    link.symlink_to(target)
    before = _snapshot(target)
    assert reap_orphans(shm_dir) == []
    with pytest.raises(RegionError, match="cannot open existing region"):
        _open("sym", shm_dir)
    assert _snapshot(target) == before and link.is_symlink()
    with pytest.raises(RegionError, match="not a regular file"):
        remove(link)
    link.unlink()
    target.unlink()


def test_a_full_tmpfs_fails_at_creation_with_a_clear_error(shm_dir: Path) -> None:
    if not ROOT:
        pytest.skip("mounting a tiny tmpfs needs root")
    mnt = shm_dir / "tiny"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if done.returncode != 0:
        mnt.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        big = Layout(hidden_dim=1024, dtype="float32", num_blocks=1024)  # 4 MiB of data
        with pytest.raises(RegionError, match=r"cannot allocate \d+ bytes .* bytes are free in") as info:
            ShmRegion.open(instance="big", dp_rank=0, layout=big, shm_dir=mnt)
        assert "lower ec_cpu_bytes" in str(info.value)
        assert list(mnt.iterdir()) == [], "a failed creation left its staging file"
        with ShmRegion.open(instance="small", dp_rank=0, layout=LAYOUT, shm_dir=mnt) as ok:
            assert ok.removed_name
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
        mnt.rmdir()


# -- list / gc ----------------------------------------------------------------------------------


def test_list_regions_tells_alive_from_orphaned_and_remove_refuses_live_ones(shm_dir: Path) -> None:
    live = _open(_instance(), shm_dir, participants=2, ranks=2)
    pid, r = _fork(lambda: str(_open(_instance(), shm_dir, participants=3).path))
    orphan = Path(_result(r))
    _kill(pid)
    infos = {info.path: info for info in list_regions(shm_dir)}
    assert set(infos) == {live.path, orphan}
    assert infos[live.path].state == "alive" and infos[live.path].creator_pid == os.getpid()
    assert infos[live.path].size_bytes == live.geometry.file_size
    assert infos[live.path].joined_pids == (os.getpid(),)
    assert infos[live.path].header is not None and infos[live.path].header.ranks == 2
    assert infos[orphan].state == "orphaned" and infos[orphan].creator_pid == pid

    with pytest.raises(RegionError, match="held by a live process"):
        remove(live.path)
    assert live.path.exists()
    assert remove(orphan) is True and not orphan.exists()
    assert remove(orphan) is False
    with pytest.raises(RegionError, match="not a region file"):
        remove(shm_dir / "something_else.bin")
    assert remove(live.path, force=True) is True
    view = live.data()  # the live process keeps its memory
    view[:2] = b"ok"
    assert bytes(view[:2]) == b"ok"
    view.release()
    live.close()
    assert list(shm_dir.glob(REGION_GLOB)) == []
