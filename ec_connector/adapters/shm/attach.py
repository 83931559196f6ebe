"""Creating and joining a region file: race-free publication and validation before any write.

The creator stages the file under a hidden name (`.vllm_ec_*.tmp`, never matching
`vllm_ec_*.mmap`), takes its liveness lock, sizes it with posix_fallocate (a full /dev/shm fails
here, with the free space in the message, instead of SIGBUS on first touch), writes the header and
publishes it with `link`, which fails if the name exists (the loser of that race joins instead);
then removes the staging name. A joiner checks the file type, owner, mode, header and size, and
only then maps it; a file that fails any check is left exactly as it was.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import time
from pathlib import Path

import structlog

from ec_connector.domain.errors import RegionError

from . import locks
from .header import PAGE, Header
from .naming import temp_file_name

log = structlog.get_logger(__name__)


def attach(path: Path, expected: Header, *, deadline: float) -> int:
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
        hint = ""
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            mode = stat.filemode(st.st_mode)
            hint = f" (uid {st.st_uid}, {mode}; this process runs as uid {os.getuid()})"
        raise RegionError(f"cannot open existing region {path}: {err.strerror}{hint}") from err
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
