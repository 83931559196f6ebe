"""The adaptive eviction policy `lecar` (ec_connector/domain/eviction_lecar.py): its weights follow the
expert whose evictions are not wanted again, its victims are that expert's, and it keeps the
table's guarantees (the property test of every candidate is in test_eviction_offline.py)."""

from __future__ import annotations

from ec_connector.domain.cache import EntryTable
from ec_connector.domain.eviction_lecar import LeCarPolicy
from tests.unit.table_helpers import hot_among_one_offs, request


def _table(num_blocks: int, **kw: float) -> tuple[EntryTable, LeCarPolicy]:
    table = EntryTable(num_blocks)
    policy = LeCarPolicy(num_blocks, table._evictable, **kw)
    table._policy = policy
    return table, policy


def test_on_stationary_popularity_the_lfu_expert_takes_over_and_keeps_the_popular_keys():
    table, policy = _table(10)
    hot = [f"h{i}" for i in range(6)]
    # LRU evicts the hot key read longest ago (it comes back: a regret), LFU a one-off (never back)
    hits = hot_among_one_offs(table, hot)
    assert policy.lru_weight < 0.05
    assert all(key in table for key in hot)
    assert hits > 0.9 * 400


def test_when_popularity_moves_the_lru_expert_takes_over_and_the_stale_keys_leave():
    table, policy = _table(10)
    old = [f"a{i}" for i in range(6)]
    for _ in range(10):  # high counts for keys never requested again
        for key in old:
            request(table, key)
    new = [f"b{i}" for i in range(8)]
    for _ in range(40):  # now 8 new keys cycle: LFU would evict them (low counts), not the stale ones
        for key in new:
            request(table, key)
    assert policy.lru_weight > 0.5
    assert sum(key in table for key in old) <= 2
    assert sum(key in table for key in new) >= 8 - 2


def test_a_regret_lowers_the_weight_of_the_expert_that_evicted_the_key():
    table, policy = _table(4, learning_rate=0.45)
    for key in "abcd":
        request(table, key)
    request(table, "a")  # "a": count 2, most recent; LRU's victim now "b", LFU's too
    weight = policy.lru_weight
    request(table, "e")  # one eviction, following one expert, is remembered in its history
    (gone,) = [key for key in "abcd" if key not in table]
    chose_lru = gone in policy._history[0]
    request(table, gone)  # the evicted key is wanted again: that expert regrets it
    assert (policy.lru_weight < weight) if chose_lru else (policy.lru_weight > weight)


def test_victims_follow_the_weights_share_of_evictions():
    # every eviction below is of a one-off that never comes back: nothing regrets, the weight stays
    table, policy = _table(50, lru_weight=0.3, history_share=40.0)  # histories hold every victim
    for n in range(1000):
        request(table, f"k{n}")
    by_lru, by_lfu = (len(history) for history in policy._history)
    assert policy.lru_weight == 0.3
    assert abs(by_lru / (by_lru + by_lfu) - 0.3) < 0.02
