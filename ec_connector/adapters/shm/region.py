"""`ShmRegion`: the Region port over one /dev/shm file shared by an engine instance's processes.

Lifecycle of the file `{shm_dir}/vllm_ec_{instance}_dp{dp_rank}.mmap` (mode 0600):

1. Every participant (the scheduler process and each TP/PCP worker of the instance) calls
   `ShmRegion.open(...)` with the same layout, `participants` and `ranks`, and its own `slot`.
   Whoever comes first creates and publishes the file atomically (attach.py); the others join it.
2. A joiner checks the file before it writes anything: regular file, owned by this uid, mode
   0600, region header, same layout/ranks/participants/ring size, exact size.
3. Each participant records its pid in its slot under the join lock; the one that completes the
   set removes the file name, exactly once. From then on a SIGKILL leaves nothing behind (the
   memory stays valid while mapped). Before all have joined, the file is held by the liveness
   locks of those that have; `reap_orphans` (run by `open` for its own name) removes it once
   they are all gone.
4. `close()` unmaps, drops the locks, and removes the name if it is still linked and nobody else
   holds the file.

No torch here: each process pins its own mapping (cudaHostRegister) in the copier, using
`data_address()`.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import structlog

from ec_connector.domain.errors import RegionError
from ec_connector.domain.layout import Layout
from ec_connector.domain.transfers import Completion

from . import locks
from .attach import attach
from .header import (
    CREATOR_PID_WORD,
    DEFAULT_RING_SLOTS,
    JOINED_WORD,
    PID_TABLE_WORD,
    UNLINKED_BY_WORD,
    Geometry,
    Header,
)
from .naming import region_file_name
from .reaper import DEFAULT_SHM_DIR, reap_orphans, unlink_if_same
from .ring import CompletionRings

log = structlog.get_logger(__name__)


class ShmRegion:
    """A Region whose data area and completion table live in one shared /dev/shm file."""

    def __init__(
        self,
        *,
        path: Path,
        fd: int,
        layout: Layout,
        geometry: Geometry,
        header: Header,
        slot: int,
        populate: bool = False,
    ) -> None:
        """Map an attached, validated file; use `ShmRegion.open`, which attaches it."""
        self._path = path
        self._fd: int | None = fd
        self._layout = layout
        self._geo = geometry
        self._header = header
        self._slot = slot
        self._removed_name = False
        self._owner_pid = os.getpid()
        flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0)
        self._mm: mmap.mmap | None = mmap.mmap(
            fd, geometry.file_size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE
        )
        self._view: memoryview | None = memoryview(self._mm)
        self._words: memoryview | None = self._view.cast("Q")
        self._rings = CompletionRings(self._words, geometry, name=str(path))
        anchor = ctypes.c_char.from_buffer(self._mm, geometry.data_offset)
        self._address = ctypes.addressof(anchor)
        del anchor  # the ctypes object pins a buffer export of the mmap until it is gone

    @classmethod
    def open(
        cls,
        *,
        instance: str,
        dp_rank: int,
        layout: Layout,
        participants: int = 1,
        slot: int = 0,
        ranks: int = 1,
        shm_dir: str | os.PathLike[str] = DEFAULT_SHM_DIR,
        ring_slots: int = DEFAULT_RING_SLOTS,
        join_timeout_s: float = 10.0,
        populate: bool = False,
    ) -> ShmRegion:
        """Create or join the region of (`instance`, `dp_rank`); blocking for at most `join_timeout_s`.

        `participants`: local processes that will open it (workers + scheduler); `slot`: this
        opener's index in 0..participants-1, unique per process; `ranks`: ranks that post
        completions (0..ranks-1). Every participant must pass the same layout, participants,
        ranks and ring_slots. `populate` pre-faults this process's page tables (MAP_POPULATE);
        the pages themselves are already allocated by the creator. Raises `BadRegionName`
        (a RegionError and ValueError) for a bad instance/dp_rank, ValueError for bad counts, and
        RegionError when the file cannot be created (e.g. /dev/shm full) or fails validation;
        a file that fails validation is left exactly as it was.
        """
        name = region_file_name(instance, dp_rank)
        if not isinstance(layout, Layout):
            raise ValueError(f"layout must be a Layout, got {type(layout).__name__}")
        geometry = Geometry(layout.data_bytes, ranks=ranks, participants=participants, ring_slots=ring_slots)
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < participants:
            raise ValueError(f"slot {slot!r} is outside 0..{participants - 1} (participants={participants})")
        if sys.byteorder != "little":
            raise RegionError("the region format is little-endian; this host is not")
        path = Path(shm_dir) / name
        reap_orphans(shm_dir, name=name)
        expected = Header.for_region(layout, geometry, pid=os.getpid(), now_ns=time.time_ns())
        fd = attach(path, expected, deadline=time.monotonic() + join_timeout_s)
        try:
            region = cls(
                path=path,
                fd=fd,
                layout=layout,
                geometry=geometry,
                header=expected,
                slot=slot,
                populate=populate,
            )
        except BaseException:
            os.close(fd)
            raise
        try:
            region._join()
        except BaseException:
            region._detach()
            raise
        return region

    # -- the Region port ------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._path.name

    @property
    def layout(self) -> Layout:
        return self._layout

    def data(self) -> memoryview:
        """The writable data area (`layout.data_bytes`); drop every view of it before `close`."""
        view = self._live_view()
        start = self._geo.data_offset
        return view[start : start + self._layout.data_bytes]

    def post_completions(self, rank: int, tickets: Sequence[int], *, ok: bool = True) -> int:
        """Append `tickets` to rank `rank`'s ring; how many fitted (see the port); ValueError if bad."""
        self._live_view()
        return self._rings.post(rank, tickets, ok)

    def drain_completions(self) -> list[Completion]:
        """Everything posted since the last drain, in posting order per rank; [] once closed."""
        if self._view is None:
            return []
        return self._rings.drain()

    def close(self) -> None:
        """Unmap, release the locks, and remove the name if still linked and nobody else holds it.

        A handle belongs to the process that opened it: in a forked child, `close` only unmaps the
        child's copy (the descriptor shares the parent's liveness lock). Open your own instead.
        """
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        self._unmap()
        if os.getpid() != self._owner_pid:
            # a forked copy of this handle: its descriptor shares the owner's lock, leave both alone
            os.close(fd)
            return
        locks.release(fd)  # drop ours first, so two closers racing cannot both see the other's lock
        try:
            if locks.try_exclusive(fd) and unlink_if_same(self._path, os.fstat(fd)):
                self._removed_name = True
                log.info("region_unlinked_on_close", path=str(self._path))
        finally:
            os.close(fd)

    # -- adapter extras -------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._path

    @property
    def geometry(self) -> Geometry:
        return self._geo

    @property
    def slot(self) -> int:
        return self._slot

    @property
    def closed(self) -> bool:
        return self._fd is None

    @property
    def removed_name(self) -> bool:
        """True if this handle removed the file name (at most one handle per file ever does)."""
        return self._removed_name

    def data_address(self) -> int:
        """Address of the data area in this process, for cudaHostRegister / NIXL registration.

        Valid until `close()`; whoever registers it must unregister before closing the region.
        """
        self._live_view()
        return self._address

    @property
    def creator_pid(self) -> int:
        """Pid of the process that created the file, as its header records it."""
        return self._live_words()[CREATOR_PID_WORD]

    def joined_pids(self) -> list[int]:
        """Pids recorded per slot (0 where a participant has not joined yet)."""
        words = self._live_words()
        return [words[PID_TABLE_WORD + i] for i in range(self._geo.participants)]

    def __enter__(self) -> ShmRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"ShmRegion({str(self._path)!r}, slot={self._slot}, {state})"

    # -- internals ------------------------------------------------------------------------------

    def _live_words(self) -> memoryview:
        if self._words is None:
            raise RegionError(f"region {self._path} is closed")
        return self._words

    def _live_view(self) -> memoryview:
        if self._view is None:
            raise RegionError(f"region {self._path} is closed")
        return self._view

    def _join(self) -> None:
        assert self._fd is not None and self._words is not None
        words, pid, participants = self._words, os.getpid(), self._geo.participants
        with locks.join_lock(self._fd):
            joined = words[JOINED_WORD]
            if words[UNLINKED_BY_WORD] or joined >= participants:
                raise RegionError(
                    f"all {participants} participants of {self._path} have already joined; "
                    f"slot {self._slot} is one too many (check `participants`, or whether another "
                    "engine uses the same instance name)"
                )
            holder = words[PID_TABLE_WORD + self._slot]
            if holder:
                raise RegionError(
                    f"slot {self._slot} of {self._path} was already joined by pid {holder}; "
                    "each participant needs its own slot"
                )
            words[PID_TABLE_WORD + self._slot] = pid
            words[JOINED_WORD] = joined + 1
            if joined + 1 == participants and unlink_if_same(self._path, os.fstat(self._fd)):
                words[UNLINKED_BY_WORD] = pid
                self._removed_name = True
        log.info(
            "region_joined",
            path=str(self._path),
            slot=self._slot,
            joined=joined + 1,
            participants=participants,
            unlinked=self._removed_name,
        )

    def _unmap(self) -> None:
        for view in (self._words, self._view):
            if view is not None:
                view.release()
        self._words = self._view = None
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                # views of data() are still alive: the mapping goes when the last of them does
                log.warning("region_unmap_deferred", path=str(self._path))

    def _detach(self) -> None:
        """Undo a failed open: unmap and drop the locks without touching the file."""
        fd, self._fd = self._fd, None
        self._unmap()
        if fd is not None:
            os.close(fd)
