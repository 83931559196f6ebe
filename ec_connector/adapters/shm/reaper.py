"""Find, list and remove region files that no live process holds.

A region file is *alive* while some process holds its liveness lock (`flock` LOCK_SH, see
locks.py) and *orphaned* otherwise: its processes are gone (a SIGKILL before every participant
joined leaves such a file). Only files named like regions (`vllm_ec_*.mmap`, plus the hidden
staging files `.vllm_ec_*.tmp` of a region being created) are ever considered, symlinks and
non-regular files are skipped, and a name is removed only while it still names the inode that
was checked. These back `ec-connector regions list|gc`.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import structlog

from ec_connector.domain.errors import RegionError

from . import locks
from .header import MAX_PARTICIPANTS, PAGE, PID_TABLE_WORD, Header
from .naming import REGION_GLOB, SUFFIX, TEMP_GLOB, is_region_name, is_temp_name

log = structlog.get_logger(__name__)

DEFAULT_SHM_DIR = "/dev/shm"
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class RegionInfo:
    """One region file as found on disk."""

    path: Path
    size_bytes: int
    uid: int
    alive: bool
    """Some live process holds it (conservatively True when it cannot be opened to check)."""
    header: Header | None
    """None when the file does not start with a region header."""
    joined_pids: tuple[int, ...] = ()

    @property
    def orphaned(self) -> bool:
        return not self.alive

    @property
    def state(self) -> str:
        return "alive" if self.alive else "orphaned"

    @property
    def creator_pid(self) -> int | None:
        return None if self.header is None else self.header.creator_pid


def _candidates(shm_dir: Path, name: str | None) -> list[Path]:
    if name is None:
        found = [*shm_dir.glob(REGION_GLOB), *shm_dir.glob(TEMP_GLOB)]
    else:
        found = [shm_dir / name, *shm_dir.glob(f".{name[: -len(SUFFIX)]}.*.tmp")]
    return sorted(p for p in found if is_region_name(p.name) or is_temp_name(p.name))


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def unlink_if_same(path: Path, st: os.stat_result) -> bool:
    """Remove `path` only if it still names the inode `st` describes; True if removed."""
    try:
        if not _same_file(os.lstat(path), st):
            return False
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def _open_checked(path: Path) -> tuple[int, os.stat_result] | None:
    """A read-only descriptor of `path` if it is a regular file; None if it is gone or not one."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    return fd, st


def reap_orphans(shm_dir: str | os.PathLike[str] = DEFAULT_SHM_DIR, *, name: str | None = None) -> list[Path]:
    """Remove region files of this uid that no live process holds; the paths removed.

    With `name` (a region file name), only that region and its staging files are considered.
    Files of other users and files some process holds are never touched.
    """
    if name is not None and not is_region_name(name):
        raise ValueError(f"name {name!r} is not a region file name (expected one like {REGION_GLOB})")
    removed: list[Path] = []
    uid = os.getuid()
    for path in _candidates(Path(shm_dir), name):
        opened = _open_checked(path)
        if opened is None:
            continue
        fd, st = opened
        try:
            if st.st_uid == uid and locks.try_exclusive(fd) and unlink_if_same(path, st):
                removed.append(path)
                log.info("region_orphan_reaped", path=str(path), size_bytes=st.st_size)
        finally:
            os.close(fd)
    return removed


def _read_info(path: Path) -> RegionInfo | None:
    opened = _open_checked(path)
    if opened is None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return RegionInfo(path=path, size_bytes=st.st_size, uid=st.st_uid, alive=True, header=None)
    fd, st = opened
    try:
        alive = not locks.try_exclusive(fd)
        raw = os.pread(fd, PAGE, 0)
    finally:
        os.close(fd)
    header = Header.parse(raw)
    pids: tuple[int, ...] = ()
    if header is not None and len(raw) == PAGE:
        table = struct.unpack_from(f"<{MAX_PARTICIPANTS}Q", raw, PID_TABLE_WORD * 8)
        pids = tuple(p for p in table[: header.participants] if p)
    return RegionInfo(
        path=path, size_bytes=st.st_size, uid=st.st_uid, alive=alive, header=header, joined_pids=pids
    )


def list_regions(shm_dir: str | os.PathLike[str] = DEFAULT_SHM_DIR) -> list[RegionInfo]:
    """Every region (and staging) file in `shm_dir`, of any owner, sorted by path."""
    infos = (_read_info(p) for p in _candidates(Path(shm_dir), None))
    return [i for i in infos if i is not None]


def remove(path: str | os.PathLike[str], *, force: bool = False) -> bool:
    """Remove one region file by hand; False if it was already gone.

    Refuses (RegionError) a path not named like a region file, a file some live process holds
    or one owned by another user, unless `force`. Processes that map a removed region keep their
    memory; only the name goes.
    """
    p = Path(path)
    if not (is_region_name(p.name) or is_temp_name(p.name)):
        raise RegionError(f"{p} is not a region file (expected a name like {REGION_GLOB})")
    opened = _open_checked(p)
    if opened is None:
        if p.is_symlink() or (p.exists() and not p.is_file()):
            raise RegionError(f"{p} is not a regular file; remove it by hand if it is yours")
        return False
    fd, st = opened
    try:
        if st.st_uid != os.getuid() and not force:
            raise RegionError(f"{p} is owned by uid {st.st_uid}, not {os.getuid()}; pass force=True")
        if not locks.try_exclusive(fd) and not force:
            raise RegionError(
                f"{p} is held by a live process; stop that engine first, or pass force=True "
                "(its processes keep their mapping, only the name goes)"
            )
        removed = unlink_if_same(p, st)
    finally:
        os.close(fd)
    if removed:
        log.info("region_removed", path=str(p), size_bytes=st.st_size, forced=force)
    return removed
