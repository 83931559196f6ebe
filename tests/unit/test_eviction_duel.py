"""The `duel` eviction policy (ec_connector/domain/eviction_duel.py): its shadow regions hit as
the plain orders they replay, it turns to the order its shadow shows hitting more and back, and
the victims follow the order it holds (with one order held, against a reference model:
test_properties_eviction.py; the table's guarantees under every policy: test_eviction.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ec_connector.domain.cache import EntryTable
from ec_connector.domain.eviction_duel import DuelPolicy, LfuShadow, LruShadow
from ec_connector.domain.eviction_lecar import LfuPolicy
from tests.unit.property_checks import SETTINGS
from tests.unit.table_helpers import hot_among_one_offs, request


def _table(num_blocks: int, **kw: float) -> tuple[EntryTable, DuelPolicy]:
    table = EntryTable(num_blocks, eviction="duel")
    policy = table._policy
    assert isinstance(policy, DuelPolicy)
    if kw:
        policy = DuelPolicy(num_blocks, table._evictable, **kw)
        table._policy = policy
    return table, policy


@SETTINGS
@given(requests=st.lists(st.tuples(st.integers(0, 12), st.integers(1, 5)), max_size=80))
def test_the_lru_shadow_hits_as_a_plain_lru_list(requests):
    shadow = LruShadow(10)
    model: list[tuple[str, int]] = []  # least recent first
    for k, rows in requests:
        key = f"k{k}"
        rows_of = dict(model)
        if key in rows_of:
            rows = rows_of[key]  # a key keeps its size while held
        expected = key in rows_of
        assert shadow.request(key, rows) is expected
        if expected:
            model.remove((key, rows))
        elif rows <= 10:
            while sum(r for _, r in model) + rows > 10:
                model.pop(0)
        else:
            continue
        model.append((key, rows))
        assert shadow.used == sum(r for _, r in model) <= 10


def test_the_lfu_shadow_keeps_the_most_requested_keys_and_refuses_what_cannot_fit():
    shadow = LfuShadow(4)
    for _ in range(3):
        for key in "ab":
            shadow.request(key, 1)
    for n in range(20):  # one-offs pass through the two free blocks
        assert shadow.request(f"once{n}", 1) is False
    assert shadow.request("a", 1) and shadow.request("b", 1)
    assert shadow.request("huge", 5) is False and shadow.used <= 4


def test_on_stationary_popularity_it_stays_with_lfu_and_keeps_the_popular_keys():
    table, policy = _table(10)
    hot = [f"h{i}" for i in range(6)]
    hits = hot_among_one_offs(table, hot)
    assert not policy.follows_lru
    assert all(key in table for key in hot)
    assert hits > 0.95 * 400


def _stale_then_cycling(table: EntryTable) -> None:
    for _ in range(10):  # high counts for keys never requested again
        for key in [f"a{i}" for i in range(6)]:
            request(table, key)
    for _ in range(40):  # 8 new keys cycle: LFU keeps the stale ones and thrashes on the new
        for key in [f"b{i}" for i in range(8)]:
            request(table, key)


def test_when_popularity_moves_it_turns_to_lru_and_the_stale_keys_leave():
    table, policy = _table(10)
    _stale_then_cycling(table)
    assert policy.follows_lru
    assert sum(f"a{i}" in table for i in range(6)) <= 2
    assert all(f"b{i}" in table for i in range(8))


def test_it_turns_back_to_lfu_when_popularity_holds_still_again():
    table, policy = _table(10)
    _stale_then_cycling(table)
    assert policy.follows_lru
    hot = [f"h{i}" for i in range(6)]
    hot_among_one_offs(table, hot)
    assert not policy.follows_lru
    assert all(key in table for key in hot)


def test_a_shadow_lead_within_its_noise_does_not_turn_it():
    """With `z` large the same evidence that turned it above is not enough."""
    table, policy = _table(10, z=50.0)
    _stale_then_cycling(table)
    assert not policy.follows_lru


def test_in_lru_order_a_held_entry_goes_round_and_the_next_is_taken():
    table, policy = _table(4)
    policy._turn()
    for key in "abcd":
        request(table, key)
    table.announce("a", now=0.0, lease_s=30.0)  # the least recent is held (announced to a peer)
    res = table.reserve("e", 1, now=1.0, lease_s=30.0)
    assert res is not None and [e.key for e in res.evicted] == ["b"]
    request(table, "c")
    res = table.reserve("f", 1, now=2.0, lease_s=30.0)
    assert res is not None and [e.key for e in res.evicted] == ["d"]  # "c" was read since
    assert policy.rank(table.get("c")) > policy.rank(table.get("e"))


def test_turning_to_lru_restarts_the_counts_so_stale_favourites_do_not_come_back_counted():
    table, policy = _table(10)
    _stale_then_cycling(table)  # "a0".."a5" were requested 10 times each, then went
    assert policy.follows_lru and "a0" not in table
    request(table, "a0")  # back: its count is the turn's 1 plus this request, not eleven
    assert policy._nodes["a0"].count == 2


def test_forget_counts_keeps_the_queue_order_and_drops_the_ghosts_counts():
    table = EntryTable(4)
    policy = LfuPolicy(4, table._evictable)
    table._policy = policy
    request(table, "a")
    for _ in range(3):
        request(table, "a")  # "a" counted most, and its count last changed before the others came
    for key in "bcd":
        request(table, key)
    request(table, "e")  # evicts "b" (fewest, oldest among equals); its count goes to the ghost
    policy.forget_counts()
    assert all(policy._nodes[k].count == 1 for k in "acde")
    res = table.reserve("f", 1, now=0.0, lease_s=30.0)
    assert res is not None and [e.key for e in res.evicted] == ["a"]  # now the oldest of equals, not "c"
    request(table, "b")
    assert policy._nodes["b"].count == 1  # the ghost forgot its count


def test_a_pull_is_not_scored_and_a_copy_read_again_only_teaches_the_shadow():
    table, policy = _table(10)
    for key in "ab":
        request(table, key)
    used, differed = policy._shadow.used, policy._differed
    assert table.reserve("c", 1, now=0.0, lease_s=30.0) is not None  # a fleet pull of "c"
    table.mark_copy("c")
    table.mark_ready("c")
    request(table, "c")  # the pulling request's load
    assert (policy._shadow.used, policy._differed) == (used, differed)
    request(table, "c")  # asked here again: this replica's own now
    assert policy._shadow.used == used + 1 and policy._differed == differed


def test_a_burst_of_new_keys_goes_before_an_older_entry_not_read_yet():
    """LFU order alone would take the oldest entry of count 1 (`early`, reserved before the burst);
    a burst's entries not read since go first, oldest first, and a read takes one out of them."""
    table, policy = _table(22, burst_run=4)
    request(table, "hot")
    request(table, "early")
    request(table, "hot")  # a read ends the run
    for n in range(20):
        request(table, f"scan{n}")  # one run of 20 never-seen keys: a burst
    request(table, "scan3")  # read: no longer the burst's
    evicted = [e.key for e in table.reserve("next", 3, now=0.0, lease_s=100.0).evicted]
    assert evicted == ["scan0", "scan1", "scan2"]
    assert policy.rank(table.get("scan4")) < policy.rank(table.get("early"))
    evicted = [e.key for e in table.reserve("more", 2, now=0.0, lease_s=100.0).evicted]
    assert evicted == ["scan4", "scan5"]


def test_new_keys_with_a_read_or_a_returning_key_between_are_no_burst():
    table, policy = _table(24, burst_run=4)
    request(table, "early")
    request(table, "gone")
    table.reserve("filler", 22, now=0.0, lease_s=100.0)  # evicts both: their counts go to the ghost
    table.drop("filler")
    request(table, "early")
    for n in range(9):
        request(table, f"new{n}")  # runs of 3 new keys, each ended by a read or a returning key
        if n % 3 == 2:
            request(table, "early" if n == 2 else "gone")
    assert not policy._burst
    evicted = [e.key for e in table.reserve("next", 16, now=0.0, lease_s=100.0).evicted]
    assert evicted[:3] == ["new0", "new1", "new2"]  # LFU order: count 1, oldest first
