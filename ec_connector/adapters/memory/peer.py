"""A data plane between in-process regions: READs copy bytes between `Region.data()` views.

`MemoryPeerWorld` is the shared "network": agents register there; tests can stall an agent (its
READs stay pending) or kill it (its READs fail and it cannot be reached).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from ec_connector.ports.peer import ReadState
from ec_connector.ports.region import Region


class MemoryPeerWorld:
    def __init__(self) -> None:
        self.agents: dict[str, MemoryPeerTransport] = {}
        self.stalled: set[str] = set()
        self._generation = itertools.count(1)

    def next_generation(self) -> int:
        return next(self._generation)

    def kill(self, name: str) -> None:
        agent = self.agents.pop(name, None)
        if agent is not None:
            agent.close()


class MemoryPeerTransport:
    def __init__(self, world: MemoryPeerWorld, name: str, region: Region) -> None:
        self._world = world
        self._name = name
        self._region = region
        self._metadata = f"mem:{name}:{world.next_generation()}".encode()
        self.peers: dict[str, bytes] = {}
        self._reads: dict[int, tuple[str, ReadState]] = {}
        self._handles = itertools.count(1)
        self.closed = False
        world.agents[name] = self

    @property
    def agent_name(self) -> str:
        return self._name

    def agent_metadata(self) -> bytes:
        return self._metadata

    def add_peer(self, name: str, metadata: bytes) -> None:
        self.peers[name] = metadata

    def remove_peer(self, name: str) -> None:
        self.peers.pop(name, None)
        for handle, (peer, state) in list(self._reads.items()):
            if peer == name and state is ReadState.PENDING:
                self._reads[handle] = (peer, ReadState.FAILED)

    def start_read(
        self,
        peer: str,
        remote_runs: Sequence[tuple[int, int]],
        local_runs: Sequence[tuple[int, int]],
    ) -> int:
        if sum(n for _, n in remote_runs) != sum(n for _, n in local_runs):
            raise ValueError("remote and local runs cover different byte counts")
        _check_runs(local_runs, self._region.layout.data_bytes, "local")
        remote = self._world.agents.get(peer)
        if peer not in self.peers or remote is None or remote.agent_metadata() != self.peers[peer]:
            raise ConnectionError(f"peer agent {peer!r} is not registered or not reachable")
        handle = next(self._handles)
        if peer in self._world.stalled:
            self._reads[handle] = (peer, ReadState.PENDING)
            return handle
        _check_runs(remote_runs, remote._region.layout.data_bytes, "remote")
        src = b"".join(bytes(remote._region.data()[o : o + n]) for o, n in remote_runs)
        dst = self._region.data()
        pos = 0
        for off, n in local_runs:
            dst[off : off + n] = src[pos : pos + n]
            pos += n
        self._reads[handle] = (peer, ReadState.DONE)
        return handle

    def read_state(self, handle: int) -> ReadState:
        peer, state = self._reads.get(handle, ("", ReadState.FAILED))
        if state is ReadState.PENDING and peer not in self._world.agents:
            return ReadState.FAILED
        return state

    def release(self, handle: int) -> None:
        self._reads.pop(handle, None)

    def close(self) -> None:
        self.closed = True
        self._reads.clear()
        if self._world.agents.get(self._name) is self:
            del self._world.agents[self._name]


def _check_runs(runs: Sequence[tuple[int, int]], size: int, side: str) -> None:
    for offset, length in runs:
        if offset < 0 or length <= 0 or offset + length > size:
            raise ValueError(f"{side} run ({offset}, {length}) is outside the {size}-byte region")
