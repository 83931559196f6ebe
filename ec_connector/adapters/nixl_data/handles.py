"""Releasing NIXL transfer handles, keeping the ones NIXL cannot abort yet.

Releasing a handle whose READ is still running asks NIXL to abort it. If NIXL cannot, the handle
is not freed and a DMA may still land in the destination blocks (the service quarantines them);
such handles are kept here and released again on later calls, and at close.
"""

from __future__ import annotations

from typing import Any

import structlog

from .errors import describe

log = structlog.get_logger(__name__)


class HandleReleaser:
    def __init__(self, agent_name: str) -> None:
        self._agent_name = agent_name
        self._stuck: list[Any] = []

    @property
    def stuck(self) -> int:
        """Handles NIXL has refused to release so far."""
        return len(self._stuck)

    def release(self, xfer: Any) -> None:
        """Release (aborting if running) a `nixl_xfer_handle`; never raises."""
        try:
            xfer.release()
        except Exception as e:
            log.warning("nixl_read_not_aborted", agent=self._agent_name, error=describe(e))
            self._stuck.append(xfer)

    def retry(self) -> None:
        stuck, self._stuck = self._stuck, []
        for xfer in stuck:
            try:
                xfer.release()
            except Exception:
                self._stuck.append(xfer)
