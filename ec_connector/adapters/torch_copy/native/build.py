"""Building the copier's C helpers (batchplan.c, launcher.c) on first use, cached.

Each library is built with the C compiler Triton itself needs on a CUDA machine (`$CC`, else `cc`,
`gcc` or `clang`) and cached per source, compiler and flags under `$EC_CONNECTOR_CACHE` (default
`~/.cache/ec_connector`, or a directory of the user's own under the temporary directory when the
home cannot be written); concurrent builds each write their own file and rename it into place.
They are loaded with ctypes. One that reads Python objects (`python=True`: the batch planner) is
built against this interpreter's headers, which Triton's launchers need too, and cached per
interpreter as well.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from ec_connector.domain.errors import ECConnectorError

FLAGS = ("-O2", "-shared", "-fPIC", "-std=c11", "-pthread")
# queue.h's EC_CALL_* numbers: which CUDA call of a queued batch failed
QUEUE_CALLS = {
    1: "cudaStreamWaitEvent (the fence)",
    2: "cudaEventRecord (start)",
    3: "the copies",
    4: "cudaEventRecord (end)",
    5: "cudaSetDevice (the launcher thread's device)",
    6: "cudaEventRecord (the fence, on the caller's stream)",
    7: "cudaStreamWaitEvent (the caller's stream on the end event)",
}


def compiler() -> str | None:
    """The C compiler the helpers are built with: $CC, else the first of cc, gcc, clang on PATH."""
    named = os.environ.get("CC")
    if named:
        return named
    for candidate in ("cc", "gcc", "clang"):
        found = shutil.which(candidate)
        if found:
            return found
    return None


def cache_dir() -> Path:
    """$EC_CONNECTOR_CACHE, else ~/.cache/ec_connector, else (a home that cannot be written) a
    directory of this user's own under the temporary directory. A library is loaded only from a
    directory this user owns and no one else can write to."""
    named = os.environ.get("EC_CONNECTOR_CACHE")
    own = Path(tempfile.gettempdir()) / f"ec_connector-{os.getuid()}"
    candidates = [Path(named)] if named else [Path.home() / ".cache" / "ec_connector", own]
    problems = []
    for folder in candidates:
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = folder.stat()
        except OSError as err:
            problems.append(f"{folder}: {err.strerror or err}")
            continue
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            problems.append(f"{folder}: not this user's own, or writable by others")
            continue
        if os.access(folder, os.W_OK):
            return folder
        problems.append(f"{folder}: not writable")
    raise ECConnectorError(
        "no cache directory for the copier's compiled helpers: "
        + "; ".join(problems)
        + "; name a writable directory of your own in $EC_CONNECTOR_CACHE"
    )


def python_headers() -> Path | None:
    """This interpreter's C headers (the directory holding Python.h), or None where not installed."""
    include = Path(sysconfig.get_paths()["include"])
    return include if (include / "Python.h").is_file() else None


def local_headers(source: Path) -> list[Path]:
    """The headers `source` includes by quoted name from its own directory (part of its cache key:
    a changed header rebuilds every library that includes it)."""
    names = re.findall(rb'^#include "([^"/]+)"', source.read_bytes(), flags=re.MULTILINE)
    return [source.with_name(name.decode()) for name in names]


def build(source: Path, what: str, *, python: bool = False) -> Path:
    """The shared library built from `source` (`what` names it in errors), from the cache if there;
    `python`: against this interpreter's headers (a library that reads Python objects)."""
    cc = compiler()
    if cc is None:
        raise ECConnectorError(
            f"TorchCopier on CUDA builds {what} ({source.name}) with a C compiler, as Triton builds "
            "its launchers, and found none: install gcc or clang, or name one in $CC"
        )
    flags = list(FLAGS)
    if python:
        include = python_headers()
        if include is None:
            raise ECConnectorError(
                f"TorchCopier on CUDA builds {what} ({source.name}) against Python's C headers, as "
                f"Triton builds its launchers, and found no Python.h in "
                f"{sysconfig.get_paths()['include']}: install this Python's development headers "
                "(python3-dev or python3-devel)"
            )
        flags += ["-I", str(include)]
    text = source.read_bytes() + b"".join(header.read_bytes() for header in local_headers(source))
    interpreter = (sys.version + str(sysconfig.get_config_var("SOABI"))) if python else ""
    setting = cc + " ".join(flags) + platform.machine() + interpreter
    key = hashlib.sha256(text + setting.encode())
    cache = cache_dir()
    target = cache / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    fd, partial = tempfile.mkstemp(prefix=target.stem, suffix=".so.partial", dir=cache)
    os.close(fd)
    try:
        command = [cc, *flags, "-o", partial, str(source)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ECConnectorError(
                f"building {what} with {cc} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}"
            )
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target
