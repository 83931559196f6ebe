"""A region in process memory: a bytearray data area and a list of posted completions.

Its completion list has no capacity: a post always records every ticket (the /dev/shm region's
rings can fill; `tests/contract/test_shm_region_data.py` covers that).
"""

from __future__ import annotations

from collections.abc import Sequence

from ec_connector.domain.errors import RegionError
from ec_connector.domain.layout import Layout
from ec_connector.domain.transfers import Completion, check_completions


class MemoryRegion:
    def __init__(self, layout: Layout, *, name: str = "memory", ranks: int = 1) -> None:
        if ranks <= 0:
            raise ValueError(f"ranks must be > 0, got {ranks}")
        self._layout = layout
        self._ranks = ranks
        self._name = name
        self._data: bytearray | None = bytearray(layout.data_bytes)
        self._completions: list[Completion] = []

    @property
    def name(self) -> str:
        return self._name

    @property
    def layout(self) -> Layout:
        return self._layout

    @property
    def closed(self) -> bool:
        return self._data is None

    def data(self) -> memoryview:
        if self._data is None:
            raise RegionError(f"region {self._name!r} is closed")
        return memoryview(self._data)

    def post_completions(self, rank: int, tickets: Sequence[int], *, ok: bool = True) -> int:
        if self._data is None:
            raise RegionError(f"region {self._name!r} is closed")
        check_completions(rank, tickets, ranks=self._ranks, region=self._name)
        self._completions.extend(Completion(rank, ticket, ok) for ticket in tickets)
        return len(tickets)

    def drain_completions(self) -> list[Completion]:
        out, self._completions = self._completions, []
        return out

    def close(self) -> None:
        self._data = None
        self._completions = []
