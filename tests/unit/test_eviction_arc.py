"""The `arc` candidate of the eviction bench (bench/eviction_arc.py): its target moves towards the
list whose evictions come back, its victims follow the target, its ghosts stay within their
bounds (the table's guarantees under it: test_eviction_offline.py's candidate property test)."""

from __future__ import annotations

from bench.eviction_arc import ArcPolicy
from ec_connector.domain.cache import EntryTable
from tests.unit.table_helpers import request


def _table(num_blocks: int, **kw: float) -> tuple[EntryTable, ArcPolicy]:
    table = EntryTable(num_blocks)
    policy = ArcPolicy(num_blocks, table._evictable, **kw)
    table._policy = policy
    return table, policy


def test_a_key_seen_once_leaves_before_a_key_read_again():
    table, _ = _table(4)
    for key in "abcd":
        request(table, key)
    request(table, "a")  # "a" moves to T2; T1 holds b, c, d over a target of 0
    request(table, "e")
    assert "a" in table and "b" not in table


def test_a_come_back_from_the_first_ghost_raises_the_target_and_keeps_the_scan_out_of_t2():
    table, policy = _table(4)
    for key in "abcd":
        request(table, key)
    request(table, "a")  # "a" in T2; b, c, d in T1
    request(table, "e")  # evicts "b" from T1 into B1 (T1 and B1 hold 4 blocks: within the region)
    assert policy.t1_target == 0 and "b" in policy._ghosts[1]
    request(table, "b")  # T1 let "b" go too early: the target grows by its rows, "b" joins T2
    assert policy.t1_target >= 1
    assert "b" in policy._lists[2]


def test_a_come_back_from_the_second_ghost_lowers_the_target():
    table, policy = _table(4, p_start=1.0)
    for key in "ab":
        request(table, key)
        request(table, key)  # a and b in T2
    for key in "cd":
        request(table, key)
    request(table, "e")  # T1 (c, d: 2 blocks) is within its target of 4: T2's LRU "a" goes to B2
    assert "a" not in table and "a" in policy._ghosts[2]
    request(table, "a")
    assert policy.t1_target < 4


def test_the_ghosts_stay_within_the_region_and_twice_it():
    table, policy = _table(8)
    for n in range(200):
        request(table, f"k{n % 37}", rows=1 + n % 3)
        rows, ghosts = policy._rows, policy._ghost_rows
        assert rows[1] + ghosts[1] <= 8 or not policy._ghosts[1]
        assert sum(rows.values()) + sum(ghosts.values()) <= 16 or not policy._ghosts[2]
