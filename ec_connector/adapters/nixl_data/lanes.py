"""`LanedPeerTransport`: one READ cut across several NIXL agents ("lanes"), copied at once.

On one host UCX moves a READ's bytes inside the post (a cma copy per descriptor), so one READ is
one single-threaded copy: ~2.2 ms for 9 MiB on a 16-core host. Each lane is a whole
`NixlPeerTransport` (its own agent, UCX worker, lock and poster thread) over the same region; a
READ is cut into up to one part per lane, whole blocks each, and every lane's poster copies its
part while the others copy theirs (the copy runs inside NIXL's post, outside the GIL).

Why lanes rather than NIXL's own UCX thread pool (`num_threads` > 1 with `split_batch_size`),
which moves a cut READ as fast (bench/nixl_parallel_read.py): with NIXL 1.5.1 a consumer whose
producer was killed during such a READ aborted when its agent was destroyed (a UCX assertion,
`ucs_arbiter_group_is_empty`). A lane is the tested single-thread path, failures included: a part
that fails makes the READ FAILED, and releasing the READ releases every part.

Lane 0 is the instance's identity: its agent name and metadata are what producers' acks and
consumers' reads use; the other lanes (named `<agent>~<i>`) run without NIXL's progress thread and
progress when `read_state` polls them. A producer only serves, so it is built with one lane.
`open_lanes` builds them as the container does.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from ec_connector.ports.peer import ReadState

from .runs import Piece
from .transport import PROGRESS_DELAY_US, AddressableRegion, NixlPeerTransport

MIN_PART_BYTES = 256 << 10  # a READ is cut only into parts at least this long


class LanedPeerTransport:
    """PeerTransport over `lanes` (NixlPeerTransports on one region); closes them on `close()`."""

    def __init__(self, lanes: Sequence[NixlPeerTransport], *, block_bytes: int) -> None:
        if not lanes:
            raise ValueError("a LanedPeerTransport needs at least one lane")
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be > 0, got {block_bytes}")
        self._lanes = tuple(lanes)
        self._block = block_bytes
        self._ids = itertools.count(1)
        self._reads: dict[int, list[tuple[NixlPeerTransport, int]]] = {}

    @property
    def agent_name(self) -> str:
        return self._lanes[0].agent_name

    def agent_metadata(self) -> bytes:
        return self._lanes[0].agent_metadata()

    def add_peer(self, name: str, metadata: bytes) -> None:
        """Load the peer on every lane (each is idempotent; a changed envelope replaces it)."""
        for lane in self._lanes:
            lane.add_peer(name, metadata)

    def remove_peer(self, name: str) -> None:
        for lane in self._lanes:
            lane.remove_peer(name)

    @property
    def peers(self) -> list[str]:
        """The peers any lane holds."""
        return sorted({peer for lane in self._lanes for peer in lane.peers})

    def start_read(
        self,
        peer: str,
        remote_runs: Sequence[tuple[int, int]],
        local_runs: Sequence[tuple[int, int]],
    ) -> int:
        """Check the runs once (lane 0), then queue one part per lane; nothing is read if refused."""
        parts = self.parts(lane_pieces=self._lanes[0].pieces(peer, remote_runs, local_runs))
        started: list[tuple[NixlPeerTransport, int]] = []
        try:
            for i, part in enumerate(parts):  # never more parts than lanes (parts())
                lane = self._lanes[i]
                started.append((lane, lane.start_pieces(peer, part)))
        except BaseException:
            for lane, handle in started:
                lane.release(handle)
            raise
        handle = next(self._ids)
        self._reads[handle] = started
        return handle

    def parts(self, *, lane_pieces: list[Piece]) -> list[list[Piece]]:
        """Cut checked pieces into at most one part per lane: equal shares, each at least
        MIN_PART_BYTES and a whole number of blocks (so block-aligned runs are cut between blocks);
        a READ shorter than two such parts stays whole, on lane 0."""
        total = sum(n for _, _, n in lane_pieces)
        share = _round_up(max(MIN_PART_BYTES, -(-total // len(self._lanes))), self._block)
        if len(self._lanes) == 1 or total < 2 * MIN_PART_BYTES:
            return [lane_pieces]
        parts: list[list[Piece]] = [[]]
        room = share
        for r, lo, n in lane_pieces:
            while n:
                if room == 0:
                    parts.append([])
                    room = share
                take = min(n, room)
                parts[-1].append((r, lo, take))
                r, lo, n, room = r + take, lo + take, n - take, room - take
        if share - room < MIN_PART_BYTES:  # a short tail rides with the part before it
            parts[-2].extend(parts.pop())
        return parts

    def read_state(self, handle: int) -> ReadState:
        """FAILED if any part failed (or the handle is unknown), DONE once every part is, else PENDING.

        Every part is polled (lanes without a progress thread advance when polled), but only the
        first pending one may wait for its poster: a poll waits at most HANDOFF_S, as one lane's.
        """
        parts = self._reads.get(handle)
        if parts is None:
            return ReadState.FAILED
        pending = False
        for lane, part in parts:
            state = lane.read_state(part, handoff=not pending)
            if state is ReadState.FAILED:
                return ReadState.FAILED
            pending = pending or state is ReadState.PENDING
        return ReadState.PENDING if pending else ReadState.DONE

    def release(self, handle: int) -> None:
        for lane, part in self._reads.pop(handle, ()):
            lane.release(part)

    def close(self) -> None:
        """Release every READ and close every lane (lane 0, the identity, last); idempotent."""
        for handle in list(self._reads):
            self.release(handle)
        for lane in reversed(self._lanes):
            lane.close()


def open_lanes(
    region: AddressableRegion,
    *,
    agent_name: str,
    lanes: int,
    backend: str = "UCX",
    ucx_error_mode: str = "peer",
    progress_thread: bool = True,
    progress_delay_us: int = PROGRESS_DELAY_US,
) -> LanedPeerTransport:
    """Lane 0 (`agent_name`, NIXL's progress thread as asked) and `lanes - 1` more agents named
    `<agent_name>~<i>` without one, over `region`; if one cannot start, those made are closed."""
    if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
        raise ValueError(f"lanes must be an int >= 1, got {lanes!r}")
    made: list[NixlPeerTransport] = []
    try:
        for i in range(lanes):
            made.append(
                NixlPeerTransport(
                    region,
                    agent_name=f"{agent_name}~{i}" if i else agent_name,
                    backend=backend,
                    ucx_error_mode=ucx_error_mode,
                    progress_thread=progress_thread if i == 0 else False,
                    progress_delay_us=progress_delay_us,
                )
            )
    except BaseException:
        for lane in made:
            lane.close()
        raise
    return LanedPeerTransport(made, block_bytes=region.layout.block_size_bytes)


def _round_up(n: int, granule: int) -> int:
    return -(-n // granule) * granule
