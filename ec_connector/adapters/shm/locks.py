"""The two kinds of lock a region file carries.

- Liveness: every process that maps the file holds `flock(LOCK_SH)` on its descriptor while it
  lives; the kernel drops it when the process dies, however it dies. Whoever obtains
  `LOCK_EX | LOCK_NB` knows that no live process holds the file.
- Join: a short exclusive open-file-description (OFD) record lock on the control page serializes
  the join bookkeeping. OFD locks, unlike classic POSIX `lockf` locks, belong to the descriptor
  rather than the process, so two mappings opened in one process exclude each other too, and
  closing another descriptor of the file does not drop them. On Linux, flock and fcntl record
  locks are independent, so the join lock never disturbs the liveness locks.
"""

from __future__ import annotations

import fcntl
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager

# struct flock on Linux (x86-64, aarch64): short l_type, short l_whence, off_t l_start,
# off_t l_len, pid_t l_pid (must be 0 for OFD locks), padded to 32 bytes
_FLOCK = struct.Struct("@hhqqi4x")


def _ofd(fd: int, kind: int, start: int, length: int) -> None:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, _FLOCK.pack(kind, os.SEEK_SET, start, length, 0))


@contextmanager
def join_lock(fd: int, start: int = 0, length: int = 4096) -> Iterator[None]:
    """Hold the exclusive join lock of the file behind `fd` (blocking; held for microseconds)."""
    _ofd(fd, fcntl.F_WRLCK, start, length)
    try:
        yield
    finally:
        _ofd(fd, fcntl.F_UNLCK, start, length)


def hold_shared(fd: int) -> bool:
    """Take the liveness lock without waiting; False if an exclusive holder (a reaper) has it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def try_exclusive(fd: int) -> bool:
    """True if no other descriptor holds a liveness lock on the file (we now hold it alone)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def release(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
