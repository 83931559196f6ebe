"""What the /dev/shm region adapter's tests share: a small layout, fresh instance names, snapshots
that show a file untouched, and forked children that open a region and can be SIGKILLed."""

from __future__ import annotations

import hashlib
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from ec_connector.adapters.shm import ShmRegion
from ec_connector.domain.layout import Layout

LAYOUT = Layout(hidden_dim=64, dtype="float16", num_blocks=96)


def instance_name() -> str:
    """A fresh instance name, so that no two tests share a region file."""
    return f"t{uuid.uuid4().hex[:10]}"


def snapshot(path: Path) -> tuple[object, ...]:
    """Inode, size, mtime, mode, owner and content digest: equal snapshots mean an untouched file."""
    st = os.lstat(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode, st.st_uid, digest)


def dir_snapshot(directory: Path) -> dict[str, tuple[object, ...]]:
    """The snapshot of every file in `directory`, by name."""
    return {p.name: snapshot(p) for p in directory.iterdir()}


def fork_child(
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


def child_result(r: int) -> str:
    """The forked child's result from its pipe (closed here); it must have succeeded."""
    out = os.read(r, 4096).decode()
    os.close(r)
    assert out.startswith("ok "), out
    return out[3:]


def sigkill(pid: int) -> None:
    """SIGKILL a forked child and reap it."""
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def open_region(instance: str, shm_dir: Path, **kw: object) -> ShmRegion:
    """Open `instance`'s region of rank 0 and `LAYOUT` under `shm_dir`; `kw` overrides the rest."""
    args: dict[str, object] = {"dp_rank": 0, "layout": LAYOUT, "shm_dir": shm_dir, **kw}
    return ShmRegion.open(instance=instance, **args)  # type: ignore[arg-type]
