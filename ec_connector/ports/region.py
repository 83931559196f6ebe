"""The shared host-memory region of one engine instance."""

from __future__ import annotations

from typing import Protocol

from ec_connector.domain.layout import Layout
from ec_connector.domain.transfers import Completion


class Region(Protocol):
    @property
    def name(self) -> str:
        """Stable name of the region (the file name for a /dev/shm region)."""
        ...

    @property
    def layout(self) -> Layout:
        """Row width, dtype and number of blocks of the data area."""
        ...

    def data(self) -> memoryview:
        """The writable data area, `layout.data_bytes` long; owned by the region, valid until close."""
        ...

    def post_completion(self, completion: Completion) -> None:
        """Record that a rank finished a copy; non-blocking; safe from any local process.

        Raises ValueError for a rank outside 0..ranks-1 or a ticket outside 1..2**62-1, and
        RegionError when the reader has fallen so far behind that the report cannot be kept
        (a report is never dropped or overwritten silently).
        """
        ...

    def drain_completions(self) -> list[Completion]:
        """Completions posted since the last drain, each returned once, in posting order per rank;
        one reader only."""
        ...

    def close(self) -> None:
        """Unmap (and, for the last user, remove) the region; idempotent."""
        ...
