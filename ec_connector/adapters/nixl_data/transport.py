"""`NixlPeerTransport`: the PeerTransport port over one NIXL agent and one registered region.

One agent per engine instance (named by the caller from engine_id). The region's data area is
registered once as DRAM (a /dev/shm-backed mmap; on CUDA hosts the same host memory). A consumer
READs (offset, length) runs of a producer's data area into runs of its own; offsets are relative
to each side's data area, and the descriptors cover contiguous stretches (runs.py), never rows.

Configuration: the agent starts with no backend (`nixl_agent_config(backends=[])`);
then `create_backend(backend, {"ucx_error_handling_mode": ucx_error_mode})` (UCX only). README.md
here: the two modes when a producer dies, the progress thread, UCX_TLS.

Thread safety: every NIXL call holds one lock (the agent runs in NIXL's unsynchronised mode).

READs are posted by a poster thread, not by the caller: on one host UCX moves a READ's bytes
inside the post itself (a cma copy: tens of ms for 32 MiB on the CPU VM), and the caller is the
engine's scheduler step. `start_read` checks the runs and queues the READ; `read_state` answers
PENDING without waiting while the poster holds the lock; `release` of a READ then is finished by
the poster (or the next caller that gets the lock). Only `add_peer` and `close` wait for the lock.

The GIL handoff: the poster runs Python before and after `transfer()` (which releases the GIL
while UCX copies). A thread waiting for the GIL gets it when the holder blocks, or else only after
the interpreter's switch interval (5 ms): releasing it for a moment (`sleep(0)`) does not hand it
over, the releasing thread takes it back first. A caller polling `read_state` in a loop therefore
held each of the poster's handoffs up to 5 ms (9 MiB READ ~20 ms, ~3 ms when posted inline;
docs/benchmarks.md, "The bare READ"). So `read_state` of the oldest READ not yet posted blocks on that
READ's "posted" event for at most `HANDOFF_S` (1 ms): the poster gets the GIL at once, and the
caller wakes as soon as the post is done (a same-host READ is then DONE). Only that one READ
waits, so a poll of many pending READs waits at most 1 ms.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import sys
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from ec_connector.domain.layout import Layout
from ec_connector.ports.peer import ReadState

from . import wire
from .errors import DataPlaneError, PeerUnreachable, backend_failure, describe, load_nixl
from .handles import HandleReleaser
from .runs import Piece, descriptor_tables, pair_runs

log = structlog.get_logger(__name__)

UCX_ERROR_MODES = ("none", "peer")
HANDOFF_S = 0.001  # the longest read_state waits for the poster (module docstring)
DROPPED_KEPT = 256  # dropped peers remembered, to name why a READ from one is refused
PROGRESS_DELAY_US = 1000
"""How long NIXL's progress thread waits in poll() between passes when no UCX event wakes it
(NIXL's `pthrDelay`; UCX rounds it up to whole milliseconds). 0 is NIXL's Python default: it
spins a core per agent."""
_STATES = {"DONE": ReadState.DONE, "PROC": ReadState.PENDING}


class AddressableRegion(Protocol):
    """A Region whose data area has a stable address in this process (ShmRegion)."""

    @property
    def layout(self) -> Layout: ...

    def data_address(self) -> int: ...


@dataclass
class _Peer:
    metadata: bytes
    info: wire.PeerInfo


@dataclass
class _Read:
    peer: str
    xfer: Any  # nixl_xfer_handle; None until posted, and once final and released
    state: ReadState = ReadState.PENDING
    posted: threading.Event = field(default_factory=threading.Event)  # the poster is done with it


@dataclass
class _Post:
    handle: int
    peer: str
    known: _Peer
    remote: Any
    local: Any


class NixlPeerTransport:
    """PeerTransport over NIXL; `close()` before closing the region.

    `progress_thread`: NIXL's own progress thread. A producer needs it (peers cannot connect
    otherwise); a consumer may do without and progress by polling `read_state`.
    `progress_delay_us`: the thread's wait between passes when no UCX event wakes it
    (`PROGRESS_DELAY_US`); 0 lets it spin a core, as NIXL's Python API always does.
    `num_threads`: the UCX backend's worker threads (0: posting a READ moves its bytes inline, so
    `start_read` of 9 MiB took ~10 ms against ~3 ms with one thread on the CPU VM; vLLM's own EC
    connector uses 1 as well).
    """

    def __init__(
        self,
        region: AddressableRegion,
        *,
        agent_name: str,
        backend: str = "UCX",
        ucx_error_mode: str = "peer",
        progress_thread: bool = True,
        progress_delay_us: int = PROGRESS_DELAY_US,
        num_threads: int = 1,
    ) -> None:
        if not isinstance(agent_name, str) or not agent_name:
            raise ValueError(f"agent_name must be a non-empty string, got {agent_name!r}")
        if ucx_error_mode not in UCX_ERROR_MODES:
            raise ValueError(f"ucx_error_mode {ucx_error_mode!r} is not one of {UCX_ERROR_MODES}")
        api = load_nixl()
        self._name = agent_name
        self._backend = backend
        self._lock = threading.RLock()
        self._peers: dict[str, _Peer] = {}
        # peers dropped because NIXL could not reload them (the last DROPPED_KEPT, by name): a later
        # READ is refused naming why, not as if the peer had never been added
        self._dropped: dict[str, str] = {}
        self._reads: dict[int, _Read] = {}
        self._handles = HandleReleaser(agent_name)
        self._ids = itertools.count(1)
        self._posts: queue.SimpleQueue[_Post | None] = queue.SimpleQueue()
        self._late_releases: deque[int] = deque()  # released while the poster held the lock
        self._queued: deque[int] = deque()  # handles queued for the poster, oldest first
        self._poster: threading.Thread | None = None
        self._base = region.data_address()
        self._size = region.layout.data_bytes
        if (
            isinstance(progress_delay_us, bool)
            or not isinstance(progress_delay_us, int)
            or progress_delay_us < 0
        ):
            raise ValueError(f"progress_delay_us must be an int >= 0, got {progress_delay_us!r}")
        try:
            self._agent = api.nixl_agent(
                agent_name, api.nixl_agent_config(enable_prog_thread=progress_thread, backends=[])
            )
            if progress_thread and progress_delay_us:
                _delay_progress_thread(api, self._agent, progress_delay_us)
        except Exception as e:
            raise DataPlaneError(f"cannot create NIXL agent {agent_name!r}: {describe(e)}") from e
        if backend not in self._agent.get_plugin_list():
            raise ValueError(
                f"NIXL backend {backend!r} is not available; installed plugins: "
                f"{sorted(self._agent.get_plugin_list())}"
            )
        if not isinstance(num_threads, int) or num_threads < 0:
            raise ValueError(f"num_threads must be an int >= 0, got {num_threads!r}")
        params = {"ucx_error_handling_mode": ucx_error_mode} if backend == "UCX" else {}
        if backend == "UCX" and num_threads:
            params["num_threads"] = str(num_threads)
        try:
            self._agent.create_backend(backend, params)
            self._reg = self._agent.register_memory(
                [(self._base, self._size, 0, "")], "DRAM", backends=[backend]
            )
            nixl_md = self._agent.get_agent_metadata()
        except Exception as e:
            self._agent = None
            raise backend_failure(backend, ucx_error_mode, e) from e
        self._metadata = wire.encode(wire.PeerInfo(self._base, self._size, nixl_md))
        log.info(
            "nixl_agent_started",
            agent=agent_name,
            backend=backend,
            ucx_error_mode=ucx_error_mode,
            area_bytes=self._size,
        )

    # -- the PeerTransport port -----------------------------------------------------------------

    @property
    def agent_name(self) -> str:
        return self._name

    def agent_metadata(self) -> bytes:
        return self._metadata

    def add_peer(self, name: str, metadata: bytes) -> None:
        """Load the peer's agent; a changed envelope (restarted producer) replaces the old agent.

        Reads still running against the replaced agent are aborted and report FAILED.
        ValueError if the envelope is malformed or names another agent; ConnectionError if NIXL
        cannot load it.
        """
        info = wire.decode(metadata, peer=name)
        with self._lock:
            self._check_open()
            known = self._peers.get(name)
            if known is not None and known.metadata == bytes(metadata):
                return
            if known is not None:
                self._forget_peer(name, reason="replaced")
            try:
                loaded = self._agent.add_remote_agent(info.nixl_metadata)
            except Exception as e:
                raise PeerUnreachable(f"cannot load the NIXL metadata of peer {name!r}: {describe(e)}") from e
            if isinstance(loaded, bytes):
                loaded = loaded.decode(errors="replace")
            if loaded != name:
                self._remove_remote(loaded)
                raise ValueError(f"metadata given for peer {name!r} is that of agent {loaded!r}")
            self._peers[name] = _Peer(bytes(metadata), info)
            self._dropped.pop(name, None)
        log.info("nixl_peer_added", peer=name, replaced=known is not None)

    def remove_peer(self, name: str) -> None:
        """Forget the peer and remove its agent: its pending READs report FAILED, new ones are
        refused as never added; idempotent."""
        with self._lock:
            self._check_open()
            self._dropped.pop(name, None)
            if name in self._peers:
                self._forget_peer(name, reason="removed")

    def start_read(
        self,
        peer: str,
        remote_runs: Sequence[tuple[int, int]],
        local_runs: Sequence[tuple[int, int]],
    ) -> int:
        """Queue one READ; ValueError (nothing read) for bad runs, ConnectionError for an unknown peer.

        The poster thread posts it. A READ NIXL refuses (the connection was lost) fails the peer's
        other pending READs, then the peer is reloaded from its last metadata and the READ posted
        once more: a producer that is still there is read again without a new handshake; one that
        is gone is refused again, and the READ reports FAILED.
        """
        return self.start_pieces(peer, self.pieces(peer, remote_runs, local_runs))

    def start_pieces(self, peer: str, pieces: list[Piece]) -> int:
        """Queue one READ of `pieces` as `pieces()` returned them (here, or on a lane of the same
        region with the same peer): no second check. ConnectionError for an unknown peer."""
        self._check_open()
        known = self._known(peer)
        remote, local = descriptor_tables(pieces, known.info.base_address, self._base)
        handle = next(self._ids)
        self._reads[handle] = _Read(peer, None)
        if self._poster is None:
            self._poster = threading.Thread(
                target=self._post_loop, name=f"nixl-post-{self._name}", daemon=True
            )
            self._poster.start()
        self._queued.append(handle)
        self._posts.put(_Post(handle, peer, known, remote, local))
        return handle

    def pieces(
        self,
        peer: str,
        remote_runs: Sequence[tuple[int, int]],
        local_runs: Sequence[tuple[int, int]],
    ) -> list[Piece]:
        """The (remote offset, local offset, length) descriptors a READ of these runs is posted as;
        the checks `start_read` makes (ValueError for bad runs, ConnectionError for an unknown peer)."""
        self._check_open()
        known = self._known(peer)
        return pair_runs(remote_runs, local_runs, remote_bytes=known.info.area_bytes, local_bytes=self._size)

    def read_state(self, handle: int, *, handoff: bool = True) -> ReadState:
        """PENDING, DONE or FAILED; FAILED for an unknown or released handle.

        Waits at most HANDOFF_S, and only for the oldest READ not yet posted (module docstring);
        `handoff=False` never waits (a caller that already waited on another READ this poll).
        """
        read = self._reads.get(handle)
        if read is None:
            return ReadState.FAILED
        if read.state is not ReadState.PENDING:
            return read.state
        if not read.posted.is_set():
            queued = self._queued
            if handoff and queued and queued[0] == handle:
                read.posted.wait(HANDOFF_S)  # blocks: the poster gets the GIL now
            if not read.posted.is_set():
                return read.state
        if not self._lock.acquire(blocking=False):
            return read.state  # final, or the poster is posting another READ: still as it was
        try:
            self._finish_late_releases()
            if read.xfer is not None and read.state is ReadState.PENDING:
                try:
                    status = self._agent.check_xfer_state(read.xfer)
                except Exception as e:
                    log.warning("nixl_read_failed", peer=read.peer, error=describe(e))
                    status = "ERR"
                read.state = _STATES.get(status, ReadState.FAILED)
                if read.state is ReadState.FAILED:
                    self._fail_pending(read.peer)
            return read.state
        finally:
            self._lock.release()

    def release(self, handle: int) -> None:
        """Forget a READ, asking NIXL to abort it if still running; idempotent; never blocks."""
        if not self._lock.acquire(blocking=False):
            self._late_releases.append(handle)
            return
        try:
            self._release(handle)
            self._finish_late_releases()
        finally:
            self._lock.release()

    def close(self) -> None:
        """Stop the poster, abort and release every READ, remove the peers, deregister; idempotent."""
        if self._poster is not None:
            self._posts.put(None)
            self._poster.join()
            self._poster = None
        with self._lock:
            if self._agent is None:
                return
            self._finish_late_releases()
            for handle in list(self._reads):
                self._release(handle)
            for name in list(self._peers):
                self._forget_peer(name, reason="closed")
            self._handles.retry()
            if self._handles.stuck:
                log.error("nixl_reads_not_aborted_at_close", agent=self._name, count=self._handles.stuck)
            try:
                self._agent.deregister_memory(self._reg, backends=[self._backend])
            except Exception as e:
                log.warning("nixl_deregister_failed", agent=self._name, error=describe(e))
            self._agent = None  # NIXL destroys the agent with its last reference
        log.info("nixl_agent_closed", agent=self._name)

    # -- adapter extras -------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._agent is None

    @property
    def peers(self) -> list[str]:
        return sorted(self._peers)

    def __enter__(self) -> NixlPeerTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------------

    def _post_loop(self) -> None:
        while (job := self._posts.get()) is not None:
            with self._lock:
                read = self._reads.get(job.handle)
                if read is None or self._agent is None:
                    pass  # released (or closing) before its turn
                elif self._peers.get(job.peer) is not job.known:
                    read.state = ReadState.FAILED  # the peer was replaced or removed meanwhile
                else:
                    self._post_read(job, read)
                with contextlib.suppress(ValueError):  # concurrent start_reads may queue out of order
                    self._queued.remove(job.handle)
                if read is not None:
                    read.posted.set()
                self._finish_late_releases()

    def _post_read(self, job: _Post, read: _Read) -> None:
        try:
            read.xfer, read.state = self._post(job.peer, job.remote, job.local)
            return
        except PeerUnreachable as first:
            self._fail_pending(job.peer)
            if not self._reload(job.peer, job.known):
                log.warning("nixl_read_refused", peer=job.peer, error=str(first))
                read.state = ReadState.FAILED
                return
            log.info("nixl_peer_reloaded", peer=job.peer, after=str(first))
        try:
            read.xfer, read.state = self._post(job.peer, job.remote, job.local)
        except PeerUnreachable as again:
            self._fail_pending(job.peer)
            log.warning("nixl_read_refused", peer=job.peer, error=str(again))
            read.state = ReadState.FAILED

    def _release(self, handle: int) -> None:
        read = self._reads.pop(handle, None)
        if read is not None and read.xfer is not None:
            self._handles.release(read.xfer)
        self._handles.retry()

    def _finish_late_releases(self) -> None:
        while self._late_releases:
            self._release(self._late_releases.popleft())

    def _check_open(self) -> None:
        if self._agent is None:
            raise RuntimeError(f"NIXL data plane {self._name!r} is closed")

    def _post(self, peer: str, remote: Any, local: Any) -> tuple[Any, ReadState]:
        try:
            xfer = self._agent.initialize_xfer(
                "READ",
                self._agent.get_xfer_descs(local, "DRAM"),
                self._agent.get_xfer_descs(remote, "DRAM"),
                peer,
                backends=[self._backend],
            )
        except Exception as e:
            raise PeerUnreachable(f"cannot prepare a READ from peer {peer!r}: {describe(e)}") from e
        try:
            status = self._agent.transfer(xfer)
        except Exception as e:
            self._handles.release(xfer)
            raise PeerUnreachable(f"READ from peer {peer!r} was refused: {describe(e)}") from e
        if status not in _STATES:
            self._handles.release(xfer)
            raise PeerUnreachable(f"READ from peer {peer!r} could not be posted; the peer is gone")
        return xfer, _STATES[status]

    def _reload(self, peer: str, known: _Peer) -> bool:
        """Drop and reload the peer's agent from its last metadata; forget the peer if NIXL refuses."""
        self._remove_remote(peer)
        try:
            self._agent.add_remote_agent(known.info.nixl_metadata)
        except Exception as e:
            log.warning("nixl_peer_reload_failed", peer=peer, error=describe(e))
            self._forget_peer(peer, reason="unreachable", loaded=False)
            self._remember_dropped(peer, "a READ was refused and NIXL could not reload its agent")
            return False
        return True

    def _fail_pending(self, peer: str, *, release_done: bool = False) -> None:
        """The connection to `peer` is gone: abort its pending READs and report them FAILED.

        In ucx_error_mode "none" UCX may never complete a READ that was in flight when its peer
        died; the next READ to that peer is refused, and this is where the stuck ones end.
        """
        for read in list(self._reads.values()):  # start_read adds to it without the lock
            if read.peer != peer or read.xfer is None:
                continue
            if read.state is ReadState.PENDING:
                read.state = ReadState.FAILED
            elif not release_done:
                continue
            self._handles.release(read.xfer)
            read.xfer = None

    def _known(self, peer: str) -> _Peer:
        """The registered peer; PeerUnreachable naming why when it is not (never added, or dropped)."""
        known = self._peers.get(peer)
        if known is not None:
            return known
        why = self._dropped.get(peer)  # one read: the poster thread may change it meanwhile
        if why is not None:
            raise PeerUnreachable(f"peer {peer!r} was dropped: {why}; add_peer it again once it is back")
        raise PeerUnreachable(f"peer agent {peer!r} is not registered; add_peer it first")

    def _remember_dropped(self, name: str, why: str) -> None:
        """Keep why `name` was dropped until it is added again (the last DROPPED_KEPT peers)."""
        self._dropped.pop(name, None)
        self._dropped[name] = why
        while len(self._dropped) > DROPPED_KEPT:
            del self._dropped[next(iter(self._dropped))]

    def _forget_peer(self, name: str, *, reason: str, loaded: bool = True) -> None:
        self._fail_pending(name, release_done=True)
        self._peers.pop(name, None)
        if loaded:
            self._remove_remote(name)
        log.info("nixl_peer_removed", peer=name, reason=reason)

    def _remove_remote(self, name: str) -> None:
        try:
            self._agent.remove_remote_agent(name)
        except Exception as e:
            log.warning("nixl_remove_peer_failed", peer=name, error=describe(e))


def _delay_progress_thread(api: Any, agent: Any, delay_us: int) -> None:
    """Give `agent`'s progress thread a poll delay of `delay_us` before any backend exists.

    NIXL 1.5.1's `nixl_agent` fixes the delay at 0 (the thread spins a core) and offers no setting;
    each backend starts its progress thread from the bound agent's config when it is created, so
    the bound agent, still without backends, is replaced by one configured alike but for the delay.
    A NIXL whose wrapper is built otherwise keeps its own thread, with a warning.
    """
    bind = getattr(sys.modules.get(type(agent).__module__), "nixlBind", None)
    if bind is None or getattr(agent, "backends", None) != {} or not hasattr(agent, "agent"):
        log.warning("nixl_progress_delay_unavailable", agent=agent.name, delay_us=delay_us)
        return
    config = bind.nixlAgentConfig()
    config.useProgThread = True
    config.useListenThread = False
    config.syncMode = api.nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE.value  # as the wrapper's, no listener
    config.pthrDelay = delay_us
    config.lthrDelay = 100_000
    config.captureTelemetry = False
    agent.agent = bind.nixlAgent(agent.name, config)
