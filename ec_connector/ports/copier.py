"""Moves entries between device buffers and the region."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ec_connector.domain.transfers import PlannedCopy, SaveJob


class Copier(Protocol):
    def check(self, payload: object, rows: int) -> None:
        """Raise LayoutMismatch unless `payload` is `rows` rows of the region's width and dtype."""
        ...

    def save(self, jobs: Sequence[SaveJob]) -> None:
        """Start copying each payload into its extents; non-blocking.

        Validates every job first: on LayoutMismatch nothing is written. The copier keeps the
        payloads alive until their copy ends.
        """
        ...

    def load(self, copies: Sequence[PlannedCopy]) -> list[object]:
        """Start copying each entry into a new device buffer; non-blocking.

        Returns the buffers in order; the caller owns them. Work queued on the device after this
        call sees the loaded bytes (the copier orders the consumer after the copy).
        """
        ...

    def poll(self) -> list[int]:
        """Tickets whose copies have ended since the last poll; non-blocking; each returned once."""
        ...

    def in_flight(self) -> int:
        """Number of copies started and not yet returned by poll."""
        ...

    def close(self) -> None:
        """Wait for copies in flight, then release streams and buffers; idempotent.

        Tickets of copies that ended meanwhile are still returned by the next poll.
        """
        ...
