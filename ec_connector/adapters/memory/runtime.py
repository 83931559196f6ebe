"""A clock the test moves by hand, and an event sink that remembers what it was given."""

from __future__ import annotations

from ec_connector.domain.transfers import CacheEvent


class ManualClock:
    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes backwards")
        self._now += seconds


class RecordingEventSink:
    def __init__(self) -> None:
        self.events: list[CacheEvent] = []
        self.closed = False

    def publish(self, event: CacheEvent) -> None:
        if not self.closed:
            self.events.append(event)

    def close(self) -> None:
        self.closed = True
