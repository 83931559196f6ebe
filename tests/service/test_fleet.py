"""Fleet sharing between two `ec_both` replicas over the in-memory adapters.

Replica A encodes and serves (its producer desk answers on the memory network); replica B learns
what A holds from A's event feed (A's recorded events, applied to B's updater as a subscriber
would) and pulls local misses through its `FleetFetcher` and the existing `ConsumerFetcher`.
"""

from __future__ import annotations

import pytest

from ec_connector.adapters.memory import (
    ManualClock,
    MemoryControlClient,
    MemoryControlServer,
    MemoryNetwork,
    MemoryPeerTransport,
    MemoryPeerWorld,
)
from ec_connector.application.consumer import ConsumerFetcher, WantedItem
from ec_connector.application.fleet import FleetFetcher, FleetStats, FleetUpdater
from ec_connector.application.producer import ProducerDesk
from ec_connector.application.roles import StepPolls
from ec_connector.application.stats import PeerStats
from ec_connector.domain.config import Role
from ec_connector.domain.directory import DirectoryLimits, Peer, PeerDirectory
from ec_connector.domain.entries import Phase
from ec_connector.domain.publish import PeerAddress
from ec_connector.domain.pull_rule import PullRule
from ec_connector.domain.scope import entry_key, scope_of
from ec_connector.domain.transfers import CacheEvent, EventKind

from .conftest import Engine, encoder_output

FP = "fingerprint"
A_ADDR = PeerAddress("10.0.0.1", 5601)
A = Peer("replica-a", A_ADDR, boot="1")
CHEAP = PullRule(encode_s_per_row=1.0)  # every pull is worth it: the flows, not the rule, are tested


class Fleet:
    """Replica A (serves) and replica B (pulls), joined by memory control and data planes."""

    def __init__(
        self, *, rule: PullRule = CHEAP, b_blocks: int = 64, encoder_cache_rows: int = 8192, **config: object
    ) -> None:
        self.clock = ManualClock(100.0)
        self.world, self.net = MemoryPeerWorld(), MemoryNetwork()
        self.a = Engine(role=Role.BOTH, clock=self.clock, **config)
        a_transport = MemoryPeerTransport(self.world, "agent-a", self.a.region)
        self.desk = ProducerDesk(
            tier=self.a.scheduler,
            config=self.a.config,
            clock=self.clock,
            fingerprint=FP,
            address=A_ADDR,
            agent_name=a_transport.agent_name,
            agent_metadata=a_transport.agent_metadata(),
            stats=PeerStats(),
        )
        self.server = MemoryControlServer(self.net, A_ADDR)
        self.server.start(self.desk.answer, self.desk.done)
        self.b = Engine(role=Role.BOTH, clock=self.clock, num_blocks=b_blocks, **config)
        self.peer_stats = PeerStats()
        fetcher = ConsumerFetcher(
            tier=self.b.scheduler,
            config=self.b.config,
            clock=self.clock,
            control=MemoryControlClient(self.net),
            transport=MemoryPeerTransport(self.world, "agent-b", self.b.region),
            fingerprint=FP,
            engine_id="replica-b",
            stats=self.peer_stats,
        )
        self.directory = PeerDirectory(DirectoryLimits(max_entries_per_peer=64, max_entries=128))
        self.stats = FleetStats()
        self.updater = FleetUpdater(
            directory=self.directory,
            clock=self.clock,
            engine_id="replica-b",
            heartbeat_timeout_s=3.0,
            stats=self.stats,
        )
        self.fleet = FleetFetcher(
            tier=self.b.scheduler,
            fetcher=fetcher,
            directory=self.directory,
            updater=self.updater,
            rule=rule,
            engine_id="replica-b",
            stats=self.stats,
            recent_local_rows=encoder_cache_rows,
        )
        self.fetcher = fetcher
        self.delivered = 0
        self.updater.peer_seen(A)

    def feed(self) -> None:
        """Deliver A's events published since the last call, with their feed sequence numbers."""
        events = self.a.events.events
        for seq, event in enumerate(events[self.delivered :], start=self.delivered + 1):
            self.updater.apply(CacheEvent(event.kind, event.mm_hash, A.peer_id, event.size_bytes), seq=seq)
        self.delivered = len(events)

    def encode_on_a(self, items: list[tuple[str, int]]) -> None:
        self.a.step(items)
        self.a.settle()
        self.feed()

    def ensure(self, items: list[tuple[str, int]], params: object = None) -> bool:
        self.fetcher.poll()
        return self.fleet.ensure_available("r1", params, [WantedItem(k, rows) for k, rows in items])

    def until_available(self, items: list[tuple[str, int]], steps: int = 10) -> bool:
        for _ in range(steps):
            if self.ensure(items):
                return True
            self.clock.advance(0.1)
        return False


def test_an_item_encoded_by_one_replica_is_pulled_by_the_other_and_not_encoded_there():
    fleet = Fleet()
    fleet.encode_on_a([("img", 6)])
    assert fleet.ensure([("img", 6)]) is False, "deferred while the pull runs"
    assert fleet.until_available([("img", 6)])
    assert fleet.b.scheduler.is_ready("img")
    result = fleet.b.step([("img", 6)])
    assert result.encoded == [] and result.loaded["img"] == encoder_output("img", 6)
    assert fleet.stats.pulls_started == fleet.stats.pulls_done == 1
    assert fleet.peer_stats.reads_done == 1
    assert fleet.a.scheduler.entry("img").grants == {}, "A's pin was released"


def _fill_b_then_save(fleet: Fleet, pulled_with: object = None) -> list[str]:
    """B encodes "own" (6 of its 16 blocks), loads "img" (6) pulled from A (through the directory,
    or `pulled_with` params an orchestrator forwarded), then saves "new" (6): what that evicts."""
    fleet.b.step([("own", 6)])
    fleet.b.settle()
    fleet.encode_on_a([("img", 6)])
    for _ in range(10):
        fleet.fetcher.poll()
        if fleet.fleet.ensure_available("r1", pulled_with, [WantedItem("img", 6)]):
            break
        fleet.clock.advance(0.1)
    assert fleet.b.step([("img", 6)]).encoded == [], "the pulling request loads the copy"
    fleet.b.settle()
    before = {e.key for e in fleet.b.scheduler.entries()}
    fleet.b.step([("new", 6)])
    fleet.b.settle()
    return sorted(before - {e.key for e in fleet.b.scheduler.entries()})


def test_a_pulled_copy_gives_way_before_what_the_replica_encoded_itself():
    fleet = Fleet(b_blocks=16)
    assert _fill_b_then_save(fleet) == ["img"], "A still holds img: B's copy goes first"
    assert fleet.a.scheduler.is_ready("img")


def test_an_item_fetched_with_forwarded_params_is_not_a_copy():
    fleet = Fleet(b_blocks=16)
    params = {"img": {"metadata": {}, "peer_host": A_ADDR.host, "peer_port": A_ADDR.port, "size_bytes": 0}}
    params["img"]["size_bytes"] = 6 * fleet.b.layout.block_size_bytes
    # an E->PD consumer's fetch: read by its request like any entry, so the unread "own" goes
    assert _fill_b_then_save(fleet, params) == ["own"]
    assert fleet.stats.pulls_started == 0


def test_a_local_hit_and_an_unknown_item_never_reach_the_network():
    fleet = Fleet()
    fleet.b.step([("mine", 3)])
    fleet.b.settle()
    assert fleet.ensure([("mine", 3), ("nobody-has-it", 3)]) is True
    assert fleet.net.sent == [] and fleet.stats.pulls_started == 0


@pytest.mark.parametrize(
    ("stored_salt", "asked_salt", "pulled"),
    [
        ("tenant-1", "tenant-1", True),
        ("tenant-1", "tenant-2", False),
        ("tenant-1", None, False),
        (None, "tenant-1", False),
        (None, None, True),
    ],
)
def test_a_request_is_served_only_entries_stored_under_its_own_scope(stored_salt, asked_salt, pulled):
    fleet = Fleet()
    fleet.encode_on_a([(entry_key("img", scope_of(stored_salt)), 4)])
    asked = entry_key("img", scope_of(asked_salt))
    fleet.until_available([(asked, 4)])
    assert fleet.b.scheduler.is_ready(asked) is pulled
    assert (fleet.net.sent != []) is pulled


def test_params_forwarded_by_an_orchestrator_take_precedence_over_the_directory():
    fleet = Fleet()
    fleet.encode_on_a([("img", 4)])
    assert fleet.ensure([("img", 4)], params={"img": {"metadata": {}}}) is True, "encode locally"
    assert fleet.net.sent == [] and fleet.stats.pulls_started == 0


def test_a_peer_whose_feed_disconnects_drops_out_at_once():
    fleet = Fleet()
    fleet.encode_on_a([("img", 4)])
    assert fleet.updater.peer_gone(A.peer_id) == 0, "its boot is known: records kept while away"
    assert fleet.ensure([("img", 4)]) is True
    assert fleet.net.sent == [] and fleet.stats.peers_left == 1
    assert fleet.stats.peers_live == 0 and fleet.stats.directory_records == 1
    fleet.clock.advance(3.1)
    fleet.updater.tick()
    assert len(fleet.directory) == 0 and fleet.stats.directory_records == 0


def test_a_peer_back_with_the_same_boot_is_pulled_from_again_and_one_with_a_new_boot_is_not():
    fleet = Fleet()
    fleet.encode_on_a([("img", 4), ("other", 4)])
    fleet.updater.peer_gone(A.peer_id)
    assert fleet.updater.peer_seen(Peer(A.peer_id, A_ADDR)) is False, "handshake first: waits for hello"
    assert fleet.updater.peer_seen(A) is True
    assert fleet.stats.peers_returned == 1 and fleet.stats.peers_live == 1
    assert fleet.until_available([("img", 4)])
    assert fleet.b.scheduler.holds("img") and fleet.stats.pulls_done == 1
    assert fleet.updater.peer_seen(Peer(A.peer_id, A_ADDR, boot="2")) is True, "restarted, never departed"
    assert fleet.stats.peers_restarted == 1 and fleet.directory.locate("other") is None
    assert fleet.ensure([("other", 4)]) is True and fleet.stats.pulls_started == 1


def test_a_peer_that_stops_beating_drops_out_after_the_heartbeat_timeout():
    fleet = Fleet()
    fleet.encode_on_a([("img", 4)])
    fleet.clock.advance(2.9)
    assert fleet.updater.tick() == []
    fleet.clock.advance(0.2)
    assert fleet.updater.tick() == [A.peer_id]
    assert fleet.ensure([("img", 4)]) is True and fleet.net.sent == []
    assert fleet.stats.peers_silent == 1


def test_an_entry_evicted_between_lookup_and_read_falls_back_and_its_record_is_forgotten():
    fleet = Fleet()
    fleet.encode_on_a([("img", 4)])
    assert fleet.a.scheduler.evict("img")  # its EVICTED event is not delivered: the directory is stale
    assert fleet.until_available([("img", 4)])
    assert not fleet.b.scheduler.holds("img")
    assert fleet.peer_stats.nack_missing == 1 and fleet.stats.pulls_failed == 1
    fleet.updater.tick()
    assert fleet.directory.locate("img") is None and fleet.stats.stale_records_forgotten == 1
    fleet.feed()  # the late EVICTED event changes nothing more
    assert fleet.stats.stale_records_forgotten == 1


def test_an_evicted_event_removes_the_entry_before_any_pull():
    fleet = Fleet()
    fleet.encode_on_a([("img", 4)])
    fleet.a.scheduler.evict("img")
    fleet.feed()
    assert fleet.ensure([("img", 4)]) is True and fleet.net.sent == []


def test_a_peer_killed_during_the_read_costs_a_fallback_within_the_fetch_bounds():
    fleet = Fleet()
    fleet.encode_on_a([("img", 4)])
    fleet.world.stalled.add("agent-a")
    assert fleet.ensure([("img", 4)]) is False  # asks
    assert fleet.ensure([("img", 4)]) is False  # acked: the READ starts
    fleet.world.kill("agent-a")
    assert fleet.ensure([("img", 4)]) is True
    assert fleet.b.scheduler.entry("img").phase is Phase.QUARANTINED
    assert fleet.stats.pulls_failed == 1


def test_no_pull_starts_when_the_local_region_cannot_take_the_item():
    fleet = Fleet(b_blocks=3)
    fleet.encode_on_a([("img", 4)])
    assert fleet.ensure([("img", 4)]) is True
    assert fleet.net.sent == []
    assert fleet.stats.pulls_not_started == 1 and fleet.stats.pulls_failed == 0
    assert fleet.directory.locate("img") is not None, "the peer's record is not blamed"


def test_a_pull_that_is_not_worth_it_is_not_started():
    fleet = Fleet(rule=PullRule(encode_s_per_row=1e-6, fixed_s=1e-3))
    fleet.encode_on_a([("img", 4)])
    assert fleet.ensure([("img", 4)]) is True
    assert fleet.net.sent == [] and fleet.stats.not_worth_it == 1


def test_an_item_vllm_allocated_here_recently_is_not_pulled():
    fleet = Fleet()
    fleet.encode_on_a([("img", 4)])
    fleet.fleet.note_local("img", 4)
    assert fleet.ensure([("img", 4)]) is True
    assert fleet.net.sent == [] and fleet.stats.skipped_recent_local == 1


def test_an_item_allocated_here_longer_ago_than_vllms_encoder_cache_holds_is_pulled():
    fleet = Fleet(encoder_cache_rows=12)  # vLLM's encoder cache: three items of 4 rows
    fleet.encode_on_a([("img", 4)])
    fleet.fleet.note_local("img", 4)
    for key in ("x1", "x2"):
        fleet.fleet.note_local(key, 4)
    fleet.fleet.note_local("img", 4)  # allocated again: the newest once more
    fleet.fleet.note_local("x3", 4)
    assert fleet.ensure([("img", 4)]) is True  # still within the last 12 rows allocated
    assert fleet.stats.skipped_recent_local == 1 and fleet.net.sent == []
    for key in ("x4", "x5"):
        fleet.fleet.note_local(key, 4)
    assert fleet.ensure([("img", 4)]) is False  # out of vLLM's cache by now: pulled from A
    assert fleet.stats.pulls_started == 1 and len(fleet.net.sent) == 1


def test_a_pull_that_lands_within_the_step_wait_is_looked_up_once():
    fleet = Fleet()
    fleet.encode_on_a([("img", 4)])
    polls = StepPolls(fleet.fleet, pull_wait_s=0.005)
    items = [WantedItem("img", 4), WantedItem("elsewhere", 4)]  # one on A, one nowhere
    assert polls.ensure_available("r1", None, items)  # pulled, read and ready within the step
    assert fleet.stats.pulls_started == 1 and fleet.stats.pulls_done == 1
    assert fleet.stats.lookups == 2 and fleet.stats.located == 1  # the recheck looked nothing up


def test_a_record_whose_size_differs_from_the_items_is_not_pulled():
    fleet = Fleet()
    fleet.encode_on_a([("img", 4)])
    assert fleet.ensure([("img", 5)]) is True
    assert fleet.stats.size_mismatches == 1 and fleet.net.sent == []


def test_the_updater_ignores_its_own_feed_and_peers_that_never_joined():
    fleet = Fleet()
    own = CacheEvent(EventKind.STORED, "img", "replica-b", 100)
    stranger = CacheEvent(EventKind.STORED, "img", "replica-z", 100)
    assert fleet.updater.apply(own) is False and fleet.updater.apply(stranger) is False
    assert fleet.updater.peer_seen(Peer("replica-b", PeerAddress("h", 1))) is False
    assert len(fleet.directory) == 0 and fleet.stats.events_ignored == 2


def test_a_gap_in_a_peers_sequence_numbers_is_counted():
    fleet = Fleet()
    fleet.updater.apply(CacheEvent(EventKind.STORED, "x", A.peer_id, 100), seq=1)
    fleet.updater.apply(CacheEvent(EventKind.STORED, "y", A.peer_id, 100), seq=4)
    assert fleet.stats.feed_gaps == 1 and len(fleet.directory) == 2


def test_a_restarted_peer_is_joined_afresh_and_its_old_records_are_gone():
    fleet = Fleet()
    fleet.encode_on_a([("img", 4)])
    assert fleet.updater.peer_seen(Peer(A.peer_id, A_ADDR, boot="2"))
    assert fleet.directory.locate("img") is None
    assert fleet.stats.peers_joined == 2


# -- the rule ------------------------------------------------------------------------------------


def test_the_default_rule_pulls_a_7b_qwen2_vl_image_on_one_host_and_not_over_a_slow_link():
    row = 3584 * 2  # bf16 rows of a 7B-sized Qwen2-VL
    rule = PullRule()
    assert rule.worth(768 * row, 768)  # a 896x672 image: ~3 ms read against ~8 ms encoded
    assert not rule.worth(64 * row, 64)  # a small item: the fixed cost dominates
    assert 150 <= (rule.break_even_rows(row) or 0) <= 200
    assert PullRule(bytes_per_s=0.6 * (1 << 30)).break_even_rows(row) is None


def test_rule_values_are_validated():
    with pytest.raises(ValueError, match="bytes_per_s"):
        PullRule(bytes_per_s=0)
    with pytest.raises(ValueError, match="margin"):
        PullRule(margin=-1)
