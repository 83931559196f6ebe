"""Time and the event feed."""

from __future__ import annotations

from typing import Protocol

from ec_connector.domain.transfers import CacheEvent


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds; non-blocking; never goes backwards."""
        ...


class EventSink(Protocol):
    def publish(self, event: CacheEvent) -> None:
        """Hand `event` to subscribers; non-blocking; drops (and counts) rather than raise."""
        ...

    def close(self) -> None:
        """Stop publishing; idempotent."""
        ...
