"""The W-TinyLFU candidate (bench/eviction_wtinylfu.py): a candidate leaving the window replaces
probation's LRU entry only when seen more often, a read in probation protects an entry, and the
hill climber moves the window's share by the hit ratio of its samples (the property test of every
candidate, the table's guarantees, is in test_eviction_offline.py)."""

from __future__ import annotations

import pytest

from bench.eviction_wtinylfu import WTinyLfuPolicy
from ec_connector.domain.cache import EntryTable

LEASE = 100.0


def _table(num_blocks: int, **kw: float | bool) -> tuple[EntryTable, WTinyLfuPolicy]:
    table = EntryTable(num_blocks)
    policy = WTinyLfuPolicy(num_blocks, table._evictable, **kw)  # type: ignore[arg-type]
    table._policy = policy
    return table, policy


def _request(table: EntryTable, key: str, rows: int = 1) -> list[str]:
    """One request of `key`: a hit reads it, a miss reserves it (returning the keys evicted) and
    marks it ready."""
    if key in table:
        table.pin(key)
        table.unpin(key)
        return []
    res = table.reserve(key, rows, now=0.0, lease_s=LEASE)
    assert res is not None
    table.mark_ready(key)
    return [e.key for e in res.evicted]


def test_a_one_off_candidate_does_not_displace_an_entry_seen_more_often():
    table, _ = _table(10, climb=False)  # window 1% of 10 blocks: every new entry leaves it at once
    for n in range(10):
        _request(table, f"k{n}")
    for n in range(10):
        _request(table, f"k{n}")  # each read once: all in protected or probation, counts 2
    evicted = [key for n in range(5) for key in _request(table, f"once{n}")]
    # the window's entry k9 (count 2) loses its tie with probation's LRU entry k0 (count 2);
    # then each one-off, leaving the window at the next reservation, loses to k0
    assert evicted == ["k9", "once0", "once1", "once2", "once3"]
    assert all(f"k{n}" in table for n in range(9))


def test_a_candidate_seen_more_often_replaces_probations_lru_entry():
    table, policy = _table(4, climb=False)
    for key in "abcd":
        _request(table, key)
    for _ in range(3):  # "e" counted three times while it was away: reserved, evicted, again
        _request(table, "e")
        for key in "bcd":
            _request(table, key)
    assert "e" in table
    # "a" (seen once, probation's LRU end at first) went; the keys read again stayed
    assert "a" not in table
    assert all(key in table for key in "bcd")


def test_a_read_in_probation_promotes_and_protected_demotes_its_lru_end_over_its_share():
    table, policy = _table(10, climb=False, protected_share=0.5)
    for n in range(10):
        _request(table, f"k{n}")
    queues = policy._queues
    for n in range(7):
        _request(table, f"k{n}")
    # protected holds at most half the main region (4.95 blocks): the 4 read last; the 3 read
    # first were demoted to probation's MRU end, oldest first
    assert list(queues[2]) == [f"k{n}" for n in range(3, 7)]
    assert list(queues[1])[-3:] == ["k0", "k1", "k2"]


def test_the_climber_shrinks_the_window_first_and_turns_back_when_the_hit_ratio_falls():
    table, policy = _table(64, window_share=0.5, sample=1.0)  # a sample: 64 requests here
    assert policy.window_share == 0.5
    for n in range(64):  # misses only: the hit ratio 0, as before: one step down, the step decays
        _request(table, f"a{n}")
    assert policy.window_share == pytest.approx(0.5 - 0.0625)
    for _ in range(64):  # hits only: the ratio rose (by 100 points): on down, the step restarts
        _request(table, "a63")
    assert policy.window_share == pytest.approx(0.5 - 0.0625 - 0.98 * 0.0625)
    for n in range(64):  # misses only again: the ratio fell: a full step back up
        _request(table, f"b{n}")
    assert policy.window_share == pytest.approx(0.5 - 0.98 * 0.0625)
