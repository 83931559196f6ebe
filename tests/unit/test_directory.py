"""The peer directory and tenant scopes: properties against a reference model, and the bounds.

Random sequences of joins (new peers, restarts, repeats, boots told or not, moved addresses), beats,
stores, evictions, departures (kept away or dropped), leaves and silence checks run side by side
with `Model`, a plain list of records in arrival order and the boot rule written out. After each
operation: `locate` answers exactly the model's latest live holder of every key it has seen, no
departed or restarted peer is ever answered, and the record counts stay within the limits.
"""

from __future__ import annotations

import os
import tracemalloc
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ec_connector.domain.directory import DirectoryLimits, Holder, Joined, Peer, PeerDirectory
from ec_connector.domain.protocol import MAX_KEY_CHARS
from ec_connector.domain.publish import PeerAddress
from ec_connector.domain.scope import SCOPE_CHARS, entry_key, identifier_of, scope_of, split_key

SETTINGS = settings(
    max_examples=int(os.environ.get("EC_FUZZ_EXAMPLES") or 250),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

PEER_IDS = ["a", "b", "c", "d"]
SALTS = [None, "tenant-1", "tenant-2"]
IDENTIFIERS = ["i0", "i1", "i2", "~i3"]
KEYS = [entry_key(i, scope_of(s)) for i in IDENTIFIERS for s in SALTS]


def peer(peer_id: str, boot: int = 1, *, moved: bool = False) -> Peer:
    """Peer `peer_id` of `boot` (0: not known), at its address or (`moved`) another."""
    port = 5600 + PEER_IDS.index(peer_id) + (100 if moved else 0)
    return Peer(peer_id, PeerAddress("10.0.0.1", port), boot=str(boot) if boot else "")


@dataclass
class Model:
    limits: DirectoryLimits
    peers: dict[str, Peer] = field(default_factory=dict)
    away: dict[str, Peer] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)
    records: list[tuple[str, str, int]] = field(default_factory=list)  # (peer id, key, size), oldest first

    def join(self, p: Peer, now: float) -> Joined:
        cur, away = self.peers.get(p.peer_id), self.away.get(p.peer_id)
        if cur is not None:
            same = cur.address == p.address and (not cur.boot or not p.boot or cur.boot == p.boot)
            if same:
                self.peers[p.peer_id] = p if p.boot else cur
                self.seen[p.peer_id] = now
                return Joined.BEAT
            self.leave(p.peer_id)
            result = Joined.RESTARTED
        elif away is not None:
            if away.address == p.address and not p.boot:
                return Joined.WAITING
            if away == p:
                self.peers[p.peer_id] = self.away.pop(p.peer_id)
                self.seen[p.peer_id] = now
                return Joined.RETURNED
            self.leave(p.peer_id)
            result = Joined.RESTARTED
        elif len(self.peers) + len(self.away) >= self.limits.max_peers:
            return Joined.REFUSED
        else:
            result = Joined.NEW
        self.peers[p.peer_id], self.seen[p.peer_id] = p, now
        return result

    def depart(self, peer_id: str, now: float) -> None:
        p = self.peers.get(peer_id)
        if p is None:
            return
        if not p.boot:
            self.leave(peer_id)
            return
        self.away[peer_id] = self.peers.pop(peer_id)
        self.seen[peer_id] = now

    def stored(self, peer_id: str, key: str, size: int) -> bool:
        if peer_id not in self.peers:
            return False
        self.records = [r for r in self.records if r[:2] != (peer_id, key)]
        self.records.append((peer_id, key, size))
        mine = [r for r in self.records if r[0] == peer_id]
        if len(mine) > self.limits.max_entries_per_peer:
            self.records.remove(mine[0])
        if len(self.records) > self.limits.max_entries:
            del self.records[0]
        return True

    def evicted(self, peer_id: str, key: str) -> bool:
        before = len(self.records)
        self.records = [r for r in self.records if r[:2] != (peer_id, key)]
        return len(self.records) != before

    def leave(self, peer_id: str) -> None:
        self.peers.pop(peer_id, None)
        self.away.pop(peer_id, None)
        self.seen.pop(peer_id, None)
        self.records = [r for r in self.records if r[0] != peer_id]

    def locate(self, key: str) -> tuple[Peer, int] | None:
        for peer_id, k, size in reversed(self.records):
            if k == key and peer_id in self.peers:
                return self.peers[peer_id], size
        return None


ops = st.lists(
    st.one_of(
        st.tuples(st.just("join"), st.sampled_from(PEER_IDS), st.integers(0, 5)),
        st.tuples(st.just("beat"), st.sampled_from(PEER_IDS), st.just(0)),
        st.tuples(st.just("store"), st.sampled_from(PEER_IDS), st.integers(0, len(KEYS) - 1)),
        st.tuples(st.just("evict"), st.sampled_from(PEER_IDS), st.integers(0, len(KEYS) - 1)),
        st.tuples(st.just("leave"), st.sampled_from(PEER_IDS), st.just(0)),
        st.tuples(st.just("depart"), st.sampled_from(PEER_IDS), st.just(0)),
        st.tuples(st.just("silent"), st.just(""), st.integers(1, 3)),
        st.tuples(st.just("tick"), st.just(""), st.integers(1, 2)),
    ),
    max_size=80,
)


@SETTINGS
@given(
    ops=ops,
    per_peer=st.integers(1, 6),
    total=st.integers(1, 10),
    max_peers=st.integers(1, 4),
)
def test_the_directory_answers_what_the_reference_model_answers(ops, per_peer, total, max_peers):
    limits = DirectoryLimits(max_entries_per_peer=per_peer, max_entries=total, max_peers=max_peers)
    directory, model = PeerDirectory(limits), Model(limits)
    now = 0.0
    for op, peer_id, arg in ops:
        if op == "join":
            new = peer(peer_id, arg % 3, moved=arg >= 3)
            assert directory.join(new, now=now) is model.join(new, now)
        elif op == "beat":
            assert directory.heartbeat(peer_id, now=now) == (peer_id in model.peers)
            if peer_id in model.peers:
                model.seen[peer_id] = now
        elif op == "store":
            size = 100 + arg
            assert directory.stored(peer_id, KEYS[arg], size) == model.stored(peer_id, KEYS[arg], size)
        elif op == "evict":
            assert directory.evicted(peer_id, KEYS[arg]) == model.evicted(peer_id, KEYS[arg])
        elif op == "leave":
            directory.leave(peer_id)
            model.leave(peer_id)
        elif op == "depart":
            directory.depart(peer_id, now=now)
            model.depart(peer_id, now)
        elif op == "silent":
            for p in [p for p in model.away if now - model.seen[p] > arg]:
                model.leave(p)
            expected = sorted(p for p in model.peers if now - model.seen[p] > arg)
            for p in expected:
                model.depart(p, now)
            assert sorted(directory.drop_silent(now=now, timeout_s=arg)) == expected
        else:
            now += arg
        for key in KEYS:
            found = directory.locate(key)
            want = model.locate(key)
            # the peer answered is the live one, as a value (its boot, once told, included)
            assert (None if found is None else (found.peer, found.size_bytes)) == want, key
        assert len(directory) == len(model.records) <= total
        for p in PEER_IDS:
            assert directory.entries_of(p) == sum(1 for r in model.records if r[0] == p) <= per_peer
        assert set(directory.peers()) == set(model.peers.values())
        assert set(directory.away()) == set(model.away.values())
        assert len(directory.peers()) + len(directory.away()) <= max_peers


@SETTINGS
@given(
    stores=st.lists(
        st.tuples(st.sampled_from(PEER_IDS), st.sampled_from(IDENTIFIERS), st.sampled_from(SALTS)),
        max_size=30,
    )
)
def test_a_lookup_under_one_scope_never_finds_an_entry_stored_under_another(stores):
    directory = PeerDirectory()
    for p in PEER_IDS:
        directory.join(peer(p), now=0.0)
    stored_under: set[tuple[str, str | None]] = set()
    for peer_id, identifier, salt in stores:
        directory.stored(peer_id, entry_key(identifier, scope_of(salt)), 1000)
        stored_under.add((identifier, salt))
    for identifier in IDENTIFIERS:
        for salt in SALTS:
            found = directory.locate_item(identifier, scope_of(salt))
            assert (found is not None) == ((identifier, salt) in stored_under)


def test_a_peer_that_leaves_is_never_answered_again_even_for_keys_another_peer_holds():
    directory = PeerDirectory()
    a, b = peer("a"), peer("b")
    directory.join(a, now=0.0)
    directory.join(b, now=0.0)
    directory.stored("a", "k", 10)
    directory.stored("b", "k", 10)
    directory.stored("b", "only-b", 10)
    assert directory.locate("k") == Holder(b, 10)
    assert directory.leave("b") == 2
    assert directory.locate("k") == Holder(a, 10)
    assert directory.locate("only-b") is None
    assert directory.stored("b", "k", 10) is False and directory.refused == 1


def test_a_restarted_peer_loses_the_records_of_its_previous_boot():
    directory = PeerDirectory()
    directory.join(peer("a", boot=1), now=0.0)
    directory.stored("a", "k", 10)
    assert directory.join(peer("a", boot=2), now=1.0)
    assert directory.locate("k") is None and len(directory) == 0


def test_a_new_boot_is_a_restart_even_when_the_peer_never_departed():
    """A fast restart behind the same port: the hello of the new process names a new boot."""
    directory = PeerDirectory()
    directory.join(peer("a", boot=1), now=0.0)
    directory.stored("a", "k", 10)
    assert directory.join(peer("a", boot=1), now=0.5) is Joined.BEAT
    assert directory.join(peer("a", boot=2), now=1.0) is Joined.RESTARTED
    assert directory.locate("k") is None and len(directory) == 0
    assert directory.peer("a") == peer("a", boot=2)


def test_a_reconnect_of_the_same_boot_keeps_the_records_and_hides_them_while_away():
    directory = PeerDirectory()
    directory.join(peer("a", boot=1), now=0.0)
    directory.stored("a", "k", 10)
    assert directory.depart("a", now=1.0) == 0
    assert directory.locate("k") is None and directory.away() == (peer("a", boot=1),)
    # its handshake comes before its hello: not served until the hello tells its boot
    assert directory.join(peer("a", boot=0), now=1.1) is Joined.WAITING
    assert directory.locate("k") is None and directory.peers() == ()
    assert directory.join(peer("a", boot=1), now=1.2) is Joined.RETURNED
    assert directory.locate("k") == Holder(peer("a", boot=1), 10)


def test_a_peer_back_with_another_boot_or_address_after_departing_loses_its_records():
    directory = PeerDirectory()
    for new in (peer("a", boot=2), peer("a", boot=1, moved=True)):
        directory.join(peer("a", boot=1), now=0.0)
        directory.stored("a", "k", 10)
        directory.depart("a", now=1.0)
        assert directory.join(new, now=1.5) is Joined.RESTARTED
        assert directory.locate("k") is None and len(directory) == 0
        directory.leave("a")


def test_a_boot_first_told_by_hello_is_no_restart():
    """A peer of the static list joins at its feed's handshake (boot not known); its first hello
    tells the boot: same process, records kept and answered with the peer as now known."""
    directory = PeerDirectory()
    directory.join(peer("a", boot=0), now=0.0)
    directory.stored("a", "k", 10)
    assert directory.join(peer("a", boot=7), now=0.5) is Joined.BEAT
    assert directory.locate("k") == Holder(peer("a", boot=7), 10)
    assert directory.join(peer("a", boot=0), now=0.6) is Joined.BEAT  # a later handshake: same process
    assert directory.peer("a") == peer("a", boot=7)


def test_a_peer_of_unknown_boot_loses_its_records_when_it_departs():
    directory = PeerDirectory()
    directory.join(peer("a", boot=0), now=0.0)
    directory.stored("a", "k", 10)
    assert directory.depart("a", now=1.0) == 1
    assert directory.away() == () and len(directory) == 0


def test_records_of_a_peer_away_longer_than_the_timeout_are_dropped_and_counted():
    directory = PeerDirectory()
    directory.join(peer("a"), now=0.0)
    directory.stored("a", "k", 10)
    directory.depart("a", now=1.0)
    assert directory.drop_silent(now=4.0, timeout_s=3.0) == [] and len(directory) == 1
    assert directory.drop_silent(now=4.5, timeout_s=3.0) == [] and len(directory) == 0
    assert directory.away() == () and directory.away_expired == 1
    assert directory.join(peer("a"), now=5.0) is Joined.NEW


def test_a_peer_away_does_not_hide_another_live_holder_of_the_same_key():
    directory = PeerDirectory()
    directory.join(peer("a"), now=0.0)
    directory.join(peer("b"), now=0.0)
    directory.stored("a", "k", 10)
    directory.stored("b", "k", 10)
    directory.depart("b", now=1.0)
    assert directory.locate("k") == Holder(peer("a"), 10)
    directory.join(peer("b"), now=1.5)
    assert directory.locate("k") == Holder(peer("b"), 10)


def test_a_peer_that_stops_beating_drops_out_after_the_timeout_and_not_before():
    directory = PeerDirectory()
    directory.join(peer("a"), now=0.0)
    directory.join(peer("b"), now=0.0)
    directory.stored("a", "k", 10)
    directory.heartbeat("b", now=2.0)
    assert directory.drop_silent(now=3.0, timeout_s=3.0) == []
    assert directory.drop_silent(now=3.5, timeout_s=3.0) == ["a"]
    assert directory.locate("k") is None
    assert [p.peer_id for p in directory.peers()] == ["b"]


def test_records_past_a_limit_drop_the_oldest_first_and_are_counted():
    directory = PeerDirectory(DirectoryLimits(max_entries_per_peer=2, max_entries=3, max_peers=2))
    directory.join(peer("a"), now=0.0)
    directory.join(peer("b"), now=0.0)
    for key in ("k1", "k2", "k3"):
        directory.stored("a", key, 10)
    assert [directory.locate(k) is not None for k in ("k1", "k2", "k3")] == [False, True, True]
    directory.stored("b", "k4", 10)
    directory.stored("b", "k5", 10)  # 4 records: the directory's oldest (a, k2) goes
    assert directory.locate("k2") is None and len(directory) == 3
    assert directory.dropped_for_limits == 2
    assert directory.join(peer("c"), now=0.0) is Joined.REFUSED and directory.refused == 1


def test_records_that_are_not_servable_are_refused():
    directory = PeerDirectory()
    directory.join(peer("a"), now=0.0)
    assert not directory.stored("a", "", 10)
    assert not directory.stored("a", "k" * (MAX_KEY_CHARS + 1), 10)
    assert not directory.stored("a", "k", 0)
    assert not directory.stored("nobody", "k", 10)
    assert directory.refused == 4 and len(directory) == 0


def test_limits_are_validated():
    with pytest.raises(ValueError, match="max_entries = 0 must be an int > 0"):
        DirectoryLimits(max_entries=0)


def test_a_record_costs_about_half_a_kibibyte_beside_its_key():
    """The directory's own share of a record (the keys here are the caller's strings); with the key
    string, docs/fleet.md gives ~0.7 KiB from bench/directory.py for sizing the limits."""
    directory = PeerDirectory(DirectoryLimits(max_entries_per_peer=20_000, max_entries=40_000))
    for p in ("a", "b"):
        directory.join(peer(p), now=0.0)
    keys = [f"{n:064x}" for n in range(20_000)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for n, key in enumerate(keys):
        directory.stored("ab"[n % 2], key, 7168 * 768)
    per_record = (tracemalloc.get_traced_memory()[0] - before) / len(keys)
    tracemalloc.stop()
    assert 100 < per_record < 800, per_record


# -- scopes --------------------------------------------------------------------------------------


@SETTINGS
@given(
    a=st.tuples(st.text(min_size=1, max_size=20), st.sampled_from(SALTS + ["", "~"])),
    b=st.tuples(st.text(min_size=1, max_size=20), st.sampled_from(SALTS + ["", "~"])),
)
def test_entry_keys_are_injective_and_split_back(a, b):
    key_a, key_b = (entry_key(i, scope_of(s)) for i, s in (a, b))
    assert split_key(key_a) == (scope_of(a[1]), a[0])
    assert (key_a == key_b) == ((a[0], scope_of(a[1])) == (b[0], scope_of(b[1])))


def test_unsalted_keys_are_vllms_identifiers_and_salted_ones_name_their_scope():
    assert entry_key("78a3", None) == "78a3" == identifier_of("78a3")
    assert entry_key("lora:78a3", scope_of("")) == "lora:78a3"
    scope = scope_of("tenant-1")
    assert scope is not None and len(scope) == SCOPE_CHARS
    assert entry_key("78a3", scope) == f"~{scope}~78a3"
    assert identifier_of(f"~{scope}~78a3") == "78a3"
    assert entry_key("~x", None) == "~~x" and split_key("~~x") == (None, "~x")


def test_a_secret_changes_every_scope_and_replicas_with_the_same_secret_agree():
    plain, keyed = scope_of("tenant-1"), scope_of("tenant-1", secret=b"fleet")
    assert plain != keyed == scope_of("tenant-1", secret=b"fleet") != scope_of("tenant-1", secret=b"other")


@pytest.mark.parametrize(
    "key", ["", "~", "~abc~x", "~" + "g" * SCOPE_CHARS + "~x", "~" + "a" * SCOPE_CHARS + "~"]
)
def test_strings_that_no_scope_made_are_not_keys(key):
    with pytest.raises(ValueError):
        split_key(key)
