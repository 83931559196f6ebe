"""The PeerTransport port's contract: one set of bodies over the in-memory fake and NIXL.

`memory`: MemoryPeerTransport over MemoryRegions in one MemoryPeerWorld. `nixl`: the consumer is a
NixlPeerTransport over a real ShmRegion in this process; each producer is a separate spawned
process holding its own ShmRegion and agent, handing its agent metadata back through a pipe (it is
filled with a seeded pattern, so the consumer can check every byte it reads). Skipped, with the
reason, where nixl is not importable.
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import random
import shutil
import signal
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ec_connector.adapters.memory import MemoryPeerTransport, MemoryPeerWorld, MemoryRegion
from ec_connector.adapters.shm import ShmRegion
from ec_connector.domain.layout import Layout
from ec_connector.ports.peer import PeerTransport, ReadState

LAYOUT = Layout(hidden_dim=64, dtype="bfloat16", num_blocks=512)  # 128-byte blocks, 64 KiB
B = LAYOUT.block_size_bytes
SENTINEL = 0xEE
BOUND_S = 10.0
HAVE_NIXL = importlib.util.find_spec("nixl") is not None


def pattern(seed: int) -> bytes:
    return random.Random(seed).randbytes(LAYOUT.data_bytes)


# -- the producer process of the real leg -----------------------------------------------------


def producer_main(name: str, shm_dir: str, seed: int, mode: str, conn: Any) -> None:
    """Spawned child: region + agent; replies ("ready", metadata); serves ("fill", seed) / ("stop",)."""
    try:
        from ec_connector.adapters.nixl_data import NixlPeerTransport

        region = ShmRegion.open(instance=name, dp_rank=0, layout=LAYOUT, shm_dir=shm_dir)
        view = region.data()
        view[:] = pattern(seed)
        view.release()
        transport = NixlPeerTransport(region, agent_name=name, ucx_error_mode=mode)
        conn.send(("ready", transport.agent_metadata()))
        while (msg := conn.recv())[0] != "stop":
            view = region.data()
            view[:] = pattern(msg[1])
            view.release()
            conn.send(("ok", None))
        transport.close()
        region.close()
        conn.send(("stopped", None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise


class ProcessProducer:
    def __init__(self, name: str, shm_dir: Path, seed: int, mode: str = "peer") -> None:
        ctx = mp.get_context("spawn")
        self.name = name
        self._conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(
            target=producer_main, args=(name, str(shm_dir), seed, mode, theirs), daemon=True
        )
        self.proc.start()
        theirs.close()
        self.metadata: bytes = self._expect("ready", timeout_s=60)

    def _expect(self, kind: str, timeout_s: float = BOUND_S) -> Any:
        assert self._conn.poll(timeout_s), f"producer {self.name} sent no {kind!r} in {timeout_s} s"
        got, body = self._conn.recv()
        assert got == kind, f"producer {self.name} sent {got!r}: {body}"
        return body

    def fill(self, seed: int) -> None:
        self._conn.send(("fill", seed))
        self._expect("ok")

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(BOUND_S)

    def stop(self) -> None:
        if self.proc.is_alive():
            self._conn.send(("stop",))
            self._expect("stopped")
            self.proc.join(BOUND_S)
        if self.proc.is_alive():
            self.kill()


class MemoryProducer:
    def __init__(self, world: MemoryPeerWorld, name: str, seed: int) -> None:
        self.name = name
        self._world = world
        self.region = MemoryRegion(LAYOUT, name=name)
        self.fill(seed)
        self.transport = MemoryPeerTransport(world, name, self.region)
        self.metadata = self.transport.agent_metadata()

    def fill(self, seed: int) -> None:
        self.region.data()[:] = pattern(seed)

    def kill(self) -> None:
        self._world.kill(self.name)

    def stop(self) -> None:
        self.transport.close()


# -- fixtures: one world per leg ----------------------------------------------------------------


class World:
    """A consumer in this process, and a way to start producers of the same leg."""

    def __init__(self, kind: str, consumer: PeerTransport, region: Any, start: Callable[..., Any]) -> None:
        self.kind = kind
        self.consumer = consumer
        self.region = region
        self.start_producer = start

    def local_bytes(self) -> bytes:
        view = self.region.data()
        try:
            return bytes(view)
        finally:
            view.release()

    def clear(self) -> None:
        view = self.region.data()
        view[:] = bytes([SENTINEL]) * LAYOUT.data_bytes
        view.release()


@pytest.fixture(scope="module")
def module_shm_dir() -> Iterator[Path]:
    """Like conftest's shm_dir, for the producer shared by a module's tests."""
    path = Path("/dev/shm") / f"ec_test_{uuid.uuid4().hex[:12]}"
    path.mkdir(mode=0o700)
    try:
        yield path
        assert sorted(p.name for p in path.iterdir()) == [], "a test left files behind"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module", params=["memory", "nixl"])
def leg(request: pytest.FixtureRequest, module_shm_dir: Path) -> Iterator[dict[str, Any]]:
    """The leg's shared producer "prod-a" (pattern seed 1), started once per module."""
    if request.param == "memory":
        world = MemoryPeerWorld()
        producer: Any = MemoryProducer(world, "prod-a", seed=1)
        yield {"kind": "memory", "world": world, "producer": producer}
    else:
        if not HAVE_NIXL:
            pytest.skip("nixl is not installed: pip install --no-deps -r requirements/p2p.txt")
        producer = ProcessProducer(f"prod-a-{uuid.uuid4().hex[:6]}", module_shm_dir, seed=1)
        yield {"kind": "nixl", "producer": producer}
    producer.stop()


@pytest.fixture
def world(leg: dict[str, Any], shm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    made: list[Any] = []
    if leg["kind"] == "memory":
        mem_world: MemoryPeerWorld = leg["world"]
        region: Any = MemoryRegion(LAYOUT, name="consumer")
        consumer: Any = MemoryPeerTransport(mem_world, f"cons-{uuid.uuid4().hex[:6]}", region)

        def start(name: str, seed: int) -> Any:
            made.append(MemoryProducer(mem_world, name, seed))
            return made[-1]
    else:
        from ec_connector.adapters.nixl_data import LanedPeerTransport, NixlPeerTransport, lanes

        region = ShmRegion.open(
            instance=f"cons-{uuid.uuid4().hex[:6]}", dp_rank=0, layout=LAYOUT, shm_dir=shm_dir
        )
        # The consumer drives NIXL progress by polling read_state (a supported set-up that spares
        # a spinning progress thread; producers keep theirs). test_nixl_data covers the default.
        # As in an engine, its READs are cut across 3 lanes (agents): here from 2 KiB up.
        monkeypatch.setattr(lanes, "MIN_PART_BYTES", 16 * B)
        name = region.name.removesuffix(".mmap")
        consumer = LanedPeerTransport(
            [
                NixlPeerTransport(region, agent_name=f"{name}~{i}" if i else name, progress_thread=False)
                for i in range(3)
            ],
            block_bytes=B,
        )

        def start(name: str, seed: int) -> Any:
            made.append(ProcessProducer(name, shm_dir, seed))
            return made[-1]

    w = World(leg["kind"], consumer, region, start)
    w.clear()
    try:
        yield w
    finally:
        consumer.close()
        for producer in made:
            producer.stop()
        region.close()


@pytest.fixture
def prod(leg: dict[str, Any], world: World) -> Any:
    """The shared producer, added to this test's consumer and holding pattern(1)."""
    producer = leg["producer"]
    producer.fill(1)
    world.consumer.add_peer(producer.name, producer.metadata)
    return producer


def wait(consumer: PeerTransport, handle: int) -> tuple[ReadState, list[ReadState]]:
    """Poll until the READ leaves PENDING (bounded); returns the final state and all states seen."""
    seen = []
    deadline = time.monotonic() + BOUND_S
    while True:
        state = consumer.read_state(handle)
        seen.append(state)
        if state is not ReadState.PENDING:
            return state, seen
        assert time.monotonic() < deadline, f"READ still pending after {BOUND_S} s"
        time.sleep(0.001)


def expected(src: bytes, remote: list[tuple[int, int]]) -> bytes:
    return b"".join(src[o : o + n] for o, n in remote)


def gathered(dst: bytes, local: list[tuple[int, int]]) -> bytes:
    return b"".join(dst[o : o + n] for o, n in local)


# -- the contract ---------------------------------------------------------------------------------


def test_read_of_several_runs_moves_the_exact_bytes(world: World, prod: Any) -> None:
    runs = [(0, 4 * B), (10 * B, 3 * B), (100 * B, 20 * B)]
    handle = world.consumer.start_read(prod.name, runs, runs)
    state, _ = wait(world.consumer, handle)
    assert state is ReadState.DONE
    dst = world.local_bytes()
    assert gathered(dst, runs) == expected(pattern(1), runs)
    untouched = set(range(LAYOUT.data_bytes)) - {i for o, n in runs for i in range(o, o + n)}
    assert all(dst[i] == SENTINEL for i in untouched)
    world.consumer.release(handle)


def test_fragmented_runs_with_different_boundaries_on_each_side(world: World, prod: Any) -> None:
    remote = [(3 * B, 5 * B), (20 * B, 2 * B), (40 * B, 9 * B), (300 * B + 16, 70)]
    local = [(100 * B, 7 * B), (10 * B, 4 * B), (50 * B, 5 * B), (400 * B + 2, 70)]
    prod.fill(5)
    handle = world.consumer.start_read(prod.name, remote, local)
    assert wait(world.consumer, handle)[0] is ReadState.DONE
    assert gathered(world.local_bytes(), local) == expected(pattern(5), remote)
    world.consumer.release(handle)


def test_read_state_goes_from_pending_to_done(world: World, prod: Any) -> None:
    runs = [(0, LAYOUT.data_bytes)]
    if world.kind != "memory":  # one run, read as one part per lane
        pieces = world.consumer.parts(lane_pieces=[(0, 0, LAYOUT.data_bytes)])
        assert [sum(n for _, _, n in part) for part in pieces] == [171 * B, 171 * B, 170 * B]
    handle = world.consumer.start_read(prod.name, runs, runs)
    final, seen = wait(world.consumer, handle)
    assert final is ReadState.DONE
    assert set(seen) <= {ReadState.PENDING, ReadState.DONE}
    assert seen[-1] is ReadState.DONE and world.consumer.read_state(handle) is ReadState.DONE
    assert world.local_bytes() == pattern(1)


def test_release_is_idempotent_and_forgets_the_read(world: World, prod: Any) -> None:
    handle = world.consumer.start_read(prod.name, [(0, B)], [(0, B)])
    wait(world.consumer, handle)
    world.consumer.release(handle)
    world.consumer.release(handle)
    world.consumer.release(987654)
    assert world.consumer.read_state(handle) is ReadState.FAILED  # unknown once released


def test_unknown_peer_is_a_connection_error(world: World, prod: Any) -> None:
    with pytest.raises(ConnectionError):
        world.consumer.start_read("nobody-" + uuid.uuid4().hex[:6], [(0, B)], [(0, B)])


def test_adding_the_same_peer_twice_is_a_no_op(world: World, prod: Any) -> None:
    world.consumer.add_peer(prod.name, prod.metadata)
    handle = world.consumer.start_read(prod.name, [(8 * B, B)], [(0, B)])
    assert wait(world.consumer, handle)[0] is ReadState.DONE
    assert world.local_bytes()[:B] == pattern(1)[8 * B : 9 * B]


MISMATCHED = [(0, 3 * B)], [(0, 2 * B)]
BAD_RUNS = {
    "totals differ": ([(0, 2 * B), (9 * B, B)], [(0, 2 * B), (5 * B, 2 * B)]),
    "remote past the end": ([(0, B), (LAYOUT.data_bytes - B, 2 * B)], [(0, 3 * B)]),
    "local past the end": ([(0, 3 * B)], [(0, B), (LAYOUT.data_bytes - B, 2 * B)]),
    "negative remote offset": ([(0, B), (-B, B)], [(0, 2 * B)]),
    "negative local offset": ([(0, 2 * B)], [(0, B), (-B, B)]),
}


# The fake copies run by run without range checks: a bad *local* run after a good one is caught
# only after the good one was written. Strict, so fixing the fake turns these into reminders.
@pytest.mark.parametrize("case", sorted(BAD_RUNS))
def test_bad_runs_are_a_value_error_and_nothing_is_read(world: World, prod: Any, case: str) -> None:
    remote, local = BAD_RUNS[case]
    with pytest.raises(ValueError):
        world.consumer.start_read(prod.name, remote, local)
    assert world.local_bytes() == bytes([SENTINEL]) * LAYOUT.data_bytes


def read_ok(world: World, peer: str, runs: list[tuple[int, int]], *, seed: int) -> None:
    """One READ of `runs` from `peer` into the same local runs: DONE, with the bytes of pattern(seed)."""
    handle = world.consumer.start_read(peer, runs, runs)
    assert wait(world.consumer, handle)[0] is ReadState.DONE
    assert gathered(world.local_bytes(), runs) == expected(pattern(seed), runs)
    world.consumer.release(handle)


def test_killed_producer_fails_reads_and_its_restart_is_read_once_added(world: World) -> None:
    """A restarted producer comes back under a new agent name (the container names each start
    anew); the consumer removes the dead agent and adds the new one, as ConsumerFetcher does."""
    name = f"prod-k-{uuid.uuid4().hex[:6]}"
    first = world.start_producer(name, seed=2)
    world.consumer.add_peer(name, first.metadata)
    runs = [(0, 64 * B)]
    read_ok(world, name, runs, seed=2)

    in_flight = world.consumer.start_read(name, runs, runs)
    first.kill()
    assert wait(world.consumer, in_flight)[0] in (ReadState.DONE, ReadState.FAILED)  # never hangs
    world.consumer.release(in_flight)
    t0 = time.monotonic()
    try:
        handle = world.consumer.start_read(name, runs, runs)
    except ConnectionError:
        pass
    else:
        assert wait(world.consumer, handle)[0] is ReadState.FAILED
        world.consumer.release(handle)
    assert time.monotonic() - t0 < BOUND_S

    second = world.start_producer(f"{name}-2", seed=3)  # this consumer lives on
    world.consumer.remove_peer(name)
    world.consumer.add_peer(second.name, second.metadata)
    world.clear()
    read_ok(world, second.name, runs, seed=3)
    with pytest.raises(ConnectionError):
        world.consumer.start_read(name, runs, runs)


def test_new_metadata_under_a_known_name_replaces_the_agent(world: World) -> None:
    """A producer stopped and started again under its old name (a transport built outside the
    container) is read after `add_peer` with its new metadata."""
    name = f"prod-r-{uuid.uuid4().hex[:6]}"
    first = world.start_producer(name, seed=2)
    world.consumer.add_peer(name, first.metadata)
    runs = [(0, 64 * B)]
    read_ok(world, name, runs, seed=2)
    first.stop()
    second = world.start_producer(name, seed=3)
    assert second.metadata != first.metadata
    world.consumer.add_peer(name, second.metadata)
    world.clear()
    read_ok(world, name, runs, seed=3)


def test_a_removed_peer_is_refused_until_added_again(world: World, prod: Any) -> None:
    runs = [(0, 64 * B)]
    in_flight = world.consumer.start_read(prod.name, runs, runs)
    world.consumer.remove_peer(prod.name)
    assert wait(world.consumer, in_flight)[0] in (ReadState.DONE, ReadState.FAILED)  # never hangs
    world.consumer.release(in_flight)
    with pytest.raises(ConnectionError):
        world.consumer.start_read(prod.name, runs, runs)
    world.consumer.remove_peer(prod.name)  # idempotent
    world.consumer.remove_peer("never-added")
    world.consumer.add_peer(prod.name, prod.metadata)
    world.clear()
    read_ok(world, prod.name, runs, seed=1)
