"""Stdlib adapters: the process's monotonic clock and an event sink that only logs."""

from __future__ import annotations

import time

import structlog

from ec_connector.domain.transfers import CacheEvent
from ec_connector.logging import debug_enabled

log = structlog.get_logger(__name__)
_debug = debug_enabled(__name__)


class SystemClock:
    """Clock port over `time.monotonic`."""

    def now(self) -> float:
        return time.monotonic()


class LogEventSink:
    """EventSink port for engines without an event feed: events become debug log lines."""

    def publish(self, event: CacheEvent) -> None:
        if _debug():
            log.debug(
                "cache_event",
                kind=event.kind.value,
                mm_hash=event.mm_hash,
                engine_id=event.engine_id,
                size_bytes=event.size_bytes,
            )

    def close(self) -> None:
        return None
