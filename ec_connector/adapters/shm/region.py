"""`ShmRegion`: the Region port over one /dev/shm file shared by an engine instance's processes.

Lifecycle of the file `{shm_dir}/vllm_ec_{instance}_dp{dp_rank}.mmap` (mode 0600):

1. Every participant (the scheduler process and each TP/PCP worker of the instance) calls
   `ShmRegion.open(...)` with the same layout, `participants` and `ranks`, and its own `slot`.
   Whoever comes first creates the file under a hidden staging name (`.vllm_ec_*.tmp`, which
   never matches `vllm_ec_*.mmap`), takes its liveness lock, sizes it with posix_fallocate (so a
   full /dev/shm fails here and not with SIGBUS later), writes the header, then publishes it with
   `link`, which fails if the name exists (the loser of that race joins the existing file
   instead), and removes the staging name. Nobody ever sees a half-written region; a staging
   file left by a crash is reaped like an orphaned region.
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
import errno
import mmap
import os
import secrets
import stat
import sys
import time
from pathlib import Path

import structlog

from ec_connector.domain.errors import RegionError
from ec_connector.domain.layout import Layout
from ec_connector.domain.transfers import Completion

from . import locks
from .header import DEFAULT_RING_SLOTS, JOINED_WORD, PAGE, PID_TABLE_WORD, UNLINKED_BY_WORD, Geometry, Header
from .naming import region_file_name, temp_file_name
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
        fd = _attach(path, expected, deadline=time.monotonic() + join_timeout_s)
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

    def post_completion(self, completion: Completion) -> None:
        """Append to rank `completion.rank`'s ring; RegionError if it is full, ValueError if bad."""
        self._live_view()
        self._rings.post(completion)

    def drain_completions(self) -> list[Completion]:
        """Everything posted since the last drain, in posting order per rank; [] once closed."""
        if self._view is None:
            return []
        return self._rings.drain()

    def close(self) -> None:
        """Unmap, release the locks, and remove the name if still linked and nobody else holds it."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        self._unmap()
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

    def joined_pids(self) -> list[int]:
        """Pids recorded per slot (0 where a participant has not joined yet)."""
        words = self._words
        if words is None:
            raise RegionError(f"region {self._path} is closed")
        return [words[PID_TABLE_WORD + i] for i in range(self._geo.participants)]

    def __enter__(self) -> ShmRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"ShmRegion({str(self._path)!r}, slot={self._slot}, {state})"

    # -- internals ------------------------------------------------------------------------------

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


def _attach(path: Path, expected: Header, *, deadline: float) -> int:
    """A descriptor of the published, validated region file at `path`, holding the liveness lock."""
    while True:
        fd = _create(path, expected)
        if fd is None:
            fd = _open_existing(path, expected)
        if fd is not None:
            return fd
        if time.monotonic() > deadline:
            raise RegionError(
                f"could neither create nor join {path} before the join timeout: the file keeps "
                "appearing and vanishing (is another engine starting and stopping with this name?)"
            )
        time.sleep(0.002)


def _create(path: Path, header: Header) -> int | None:
    """Create and publish the region file; None if the name already exists (join it instead)."""
    staged = path.parent / temp_file_name(path.name, os.getpid(), secrets.token_hex(4))
    try:
        fd = os.open(staged, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise RegionError(f"cannot create region {path} (staged as {staged.name}): {err.strerror}") from err
    try:
        os.fchmod(fd, 0o600)  # the umask may only have narrowed it; make it exact
        if not locks.hold_shared(fd):  # a reaper found the staging file in the instant before this
            raise FileNotFoundError(errno.ENOENT, "staging file reaped")
        _allocate(fd, path, header.file_size)
        os.pwrite(fd, header.pack(), 0)
        os.link(staged, path)  # atomic publish: fails if the name exists
    except (FileExistsError, FileNotFoundError):
        os.close(fd)
        return None
    except RegionError:
        os.close(fd)
        raise
    except OSError as err:
        os.close(fd)
        raise RegionError(f"cannot create region {path}: {err.strerror}") from err
    except BaseException:
        os.close(fd)
        raise
    finally:
        staged.unlink(missing_ok=True)
    log.info(
        "region_created",
        path=str(path),
        size_bytes=header.file_size,
        participants=header.participants,
        ranks=header.ranks,
    )
    return fd


def _allocate(fd: int, path: Path, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        try:
            vfs = os.statvfs(path.parent)
            free = f"{vfs.f_bavail * vfs.f_frsize} bytes are free"
        except OSError:
            free = "free space unknown"
        raise RegionError(
            f"cannot allocate {size} bytes for region {path} ({err.strerror}); {free} in "
            f"{path.parent}: lower ec_cpu_bytes or enlarge {path.parent}"
        ) from err


def _open_existing(path: Path, expected: Header) -> int | None:
    """The existing region file, checked and held; None if it vanished meanwhile (retry)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise RegionError(f"cannot open existing region {path}: {err.strerror}") from err
    try:
        st = os.fstat(fd)
        _check_file(path, st)
        if not locks.hold_shared(fd):
            os.close(fd)
            return None  # a reaper or a closer holds it exclusively: it is about to go
        try:
            current = os.lstat(path)
        except FileNotFoundError:
            current = None
        if current is None or (current.st_dev, current.st_ino) != (st.st_dev, st.st_ino):
            os.close(fd)
            return None
        _check_header(path, os.pread(fd, PAGE, 0), expected, st.st_size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_file(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise RegionError(f"{path} is not a regular file; remove it (it is not a region)")
    if st.st_uid != os.getuid():
        raise RegionError(
            f"{path} is owned by uid {st.st_uid}, not by this process's uid {os.getuid()}; refusing "
            "to share it: remove it or pick another engine_id"
        )
    if stat.S_IMODE(st.st_mode) != 0o600:
        mode = stat.S_IMODE(st.st_mode)
        raise RegionError(f"{path} has mode {mode:#o}, expected 0o600; refusing to use it")


def _check_header(path: Path, raw: bytes, expected: Header, size: int) -> None:
    found = Header.parse(raw)
    if found is None:
        raise RegionError(f"{path} does not start with a region header (bad magic); it is not a region")
    problems = found.mismatches(expected)
    if size != expected.file_size:
        problems.append(f"size: file has {size} bytes, expected {expected.file_size}")
    if problems:
        raise RegionError(
            f"{path} (created by pid {found.creator_pid}) does not match this engine's region: "
            + "; ".join(problems)
            + " — every participant must pass the same layout, ranks and participants"
        )
