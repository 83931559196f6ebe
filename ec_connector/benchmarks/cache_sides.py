"""The caches the cache benches replay traces against, behind one small interface.

`OursSide` is our EntryTable with the RLock our TierScheduler holds around it; `BaselineSide` is
vLLM's EmbeddingCache (it locks inside every method). The driver is `compare_cache.py`'s
`replay`; `bench/eviction.py` uses the same sides.
"""

from __future__ import annotations

import threading
from typing import cast

from ec_connector.benchmarks.cache_traces import ROW_BYTES
from ec_connector.domain.cache import EntryTable
from ec_connector.domain.config import MAX_ENTRY_RUNS, MIN_RUN_BYTES
from ec_connector.domain.entries import Entry, Phase
from ec_connector.domain.eviction import DEFAULT_POLICY
from ec_connector.domain.layout import Layout

ABSENT, NOT_READY, READY = 0, 1, 2
_READY = Phase.READY


class OursSide:
    """EntryTable + ExtentAllocator, with the RLock our TierScheduler holds around the table."""

    name = "ours"

    def __init__(
        self, num_blocks: int, max_runs: int = MAX_ENTRY_RUNS, eviction: str = DEFAULT_POLICY
    ) -> None:
        # with the shipped run floor and cap (ec_min_run_bytes', ec_max_entry_runs' defaults), as
        # the scheduler builds it
        layout = Layout(hidden_dim=ROW_BYTES // 2, dtype="bfloat16", num_blocks=num_blocks)
        self.table = EntryTable(
            num_blocks, min_run=layout.blocks_for(MIN_RUN_BYTES), max_runs=max_runs, eviction=eviction
        )
        self.phase_of = self.table.phase_of
        self.lock = threading.RLock()
        self.now = 0.0

    def tick(self, now: float) -> None:
        self.now = now
        with self.lock:
            self.table.expire(now, quarantine_s=60.0)

    def lookup(self, key: str) -> int:
        phase = self.phase_of(key)  # as TierScheduler.has_item, after the step's poll (tick)
        if phase is None:
            return ABSENT
        return READY if phase is _READY else NOT_READY

    def alloc(self, key: str, rows: int) -> bool:
        with self.lock:
            return self.table.reserve(key, rows, now=self.now, lease_s=30.0) is not None

    def ready(self, key: str) -> None:
        with self.lock:
            self.table.mark_ready(key)

    def pin(self, key: str) -> None:
        with self.lock:
            self.table.pin(key)

    def unpin(self, key: str) -> None:
        with self.lock:
            self.table.unpin(key)

    def discard(self, key: str) -> None:
        with self.lock:
            self.table.drop(key)

    # untimed inspection
    def runs(self, key: str) -> int:
        return len(cast(Entry, self.table.get(key)).extents)  # called right after a successful alloc

    def live_runs(self) -> list[int]:
        return [len(e.extents) for e in self.table.entries()]

    def entries(self) -> int:
        return len(self.table)


class BaselineSide:
    """vLLM's EmbeddingCache (it locks inside every method)."""

    name = "vllm"

    def __init__(self, num_blocks: int, cache_cls: type) -> None:
        self.cache = cache_cls(num_blocks)

    def tick(self, now: float) -> None:
        pass

    def lookup(self, key: str) -> int:
        entry = self.cache.get(key)
        if entry is None:
            return ABSENT
        return READY if entry.ready else NOT_READY

    def alloc(self, key: str, rows: int) -> bool:
        return self.cache.alloc(key, rows, (rows, ROW_BYTES // 2)) is not None

    def ready(self, key: str) -> None:
        self.cache.mark_ready(key)

    def pin(self, key: str) -> None:
        self.cache.pin(key)

    def unpin(self, key: str) -> None:
        self.cache.unpin(key)

    def discard(self, key: str) -> None:
        self.cache.discard(key)

    # untimed inspection
    def runs(self, key: str) -> int:
        return _runs_of(self.cache.get(key).block_ids)

    def live_runs(self) -> list[int]:
        return [_runs_of(e.block_ids) for e in self.cache._entries.values()]

    def entries(self) -> int:
        return len(self.cache._entries)


def _runs_of(block_ids: tuple[int, ...]) -> int:
    return 1 + sum(1 for a, b in zip(block_ids, block_ids[1:], strict=False) if b != a + 1)
