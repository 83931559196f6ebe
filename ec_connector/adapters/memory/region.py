"""A region in process memory: a bytearray data area and a list of posted completions."""

from __future__ import annotations

from ec_connector.domain.errors import RegionError
from ec_connector.domain.layout import Layout
from ec_connector.domain.transfers import TICKET_LIMIT, Completion


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

    def post_completion(self, completion: Completion) -> None:
        if self._data is None:
            raise RegionError(f"region {self._name!r} is closed")
        if not 0 <= completion.rank < self._ranks:
            raise ValueError(f"rank {completion.rank} is outside 0..{self._ranks - 1}")
        if not 0 < completion.ticket < TICKET_LIMIT:
            raise ValueError(f"ticket {completion.ticket} is outside 1..2**62-1")
        self._completions.append(completion)

    def drain_completions(self) -> list[Completion]:
        out, self._completions = self._completions, []
        return out

    def close(self) -> None:
        self._data = None
        self._completions = []
