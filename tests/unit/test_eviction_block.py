"""The per-block candidates of the eviction bench (bench/eviction_block.py, its heap, and
bench/eviction_block_buckets.py, its quantised queues): with one size of item they decide as `lfu`
and `duel`; with sizes they rank by count per block; `duel-block` turns with a per-block LFU
shadow (the table's guarantees under them: test_eviction_offline.py's candidate property test)."""

from __future__ import annotations

import random

from bench.eviction_block import BlockDuelPolicy, BlockLfuPolicy, BlockLfuShadow
from bench.eviction_block_buckets import bucket_classes
from ec_connector.domain.cache import EntryTable
from ec_connector.domain.eviction import EvictionPolicy
from ec_connector.domain.eviction_duel import DuelPolicy
from ec_connector.domain.eviction_lecar import LfuPolicy
from tests.unit.table_helpers import request


def _table(num_blocks: int, kind: type) -> EntryTable:
    table = EntryTable(num_blocks)
    policy: EvictionPolicy = kind(num_blocks, table._evictable)
    table._policy = policy
    return table


def test_with_one_size_they_decide_as_lfu_and_duel():
    rng = random.Random(3)
    # popularity that moves once, so the duels turn and the LFU orders age
    keys = [f"k{rng.randrange(12)}" for _ in range(300)] + [f"m{rng.randrange(12)}" for _ in range(300)]
    lfu_bucket, duel_bucket = bucket_classes()
    pairs = (
        (LfuPolicy, BlockLfuPolicy),
        (DuelPolicy, BlockDuelPolicy),
        (LfuPolicy, lfu_bucket),
        (DuelPolicy, duel_bucket),
    )
    for plain, block in pairs:
        a, b = _table(16, plain), _table(16, block)
        for key in keys:
            assert request(a, key, 2) == request(b, key, 2), (plain.__name__, key)
            assert {e.key for e in a.entries()} == {e.key for e in b.entries()}


def test_a_large_entry_read_as_often_as_a_small_one_goes_first():
    cases = [(BlockLfuPolicy, {"small", "new"}), (LfuPolicy, {"small"})]
    cases += [(bucket_classes(k)[0], {"small", "new"}) for k in (1, 16)]
    for kind, survivors in cases:
        table = _table(6, kind)
        request(table, "big", 4)
        request(table, "small", 1)
        request(table, "big", 4)
        request(table, "small", 1)
        request(table, "new", 1)  # count 1, one block: above big's 2 counts in 4 blocks
        request(table, "x", 2)
        assert {e.key for e in table.entries()} == survivors | {"x"}, kind.__name__


def test_duel_block_turns_to_lru_with_a_per_block_lfu_shadow():
    table = _table(10, BlockDuelPolicy)
    policy = table._policy
    assert isinstance(policy, BlockDuelPolicy)
    for _ in range(10):  # high counts for keys never requested again
        for key in [f"a{i}" for i in range(6)]:
            request(table, key)
    for _ in range(40):  # new keys cycle: LFU keeps the stale ones, LRU hits
        for key in [f"b{i}" for i in range(8)]:
            request(table, key)
    assert policy.follows_lru and isinstance(policy._shadow, BlockLfuShadow)
    assert all(f"b{i}" in table for i in range(8))
