"""What the real-engine demos print, kept apart from what their engines log.

vLLM, torch and transformers write log lines and warnings to file descriptors 1 and 2, some of them
from C, so redirecting `sys.stdout` alone would not catch them. `story_and_log` points both
descriptors of this process at a log file and returns a stream to the terminal for the demo's own
lines.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TextIO


def story_and_log(log: Path) -> TextIO:
    """Send this process's stdout and stderr (fds 1 and 2) to `log`; return a stream to the old stdout.

    The log is appended to and created if needed; the returned stream is line-buffered, so each of the
    demo's lines shows as it is printed.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    terminal = os.fdopen(os.dup(1), "w", buffering=1)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    return terminal
