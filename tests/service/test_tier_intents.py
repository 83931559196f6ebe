"""The tier scheduler's intent methods: what each does to the entry table, and what it refuses."""

from __future__ import annotations

from ec_connector.domain.config import Role
from ec_connector.domain.entries import Phase
from ec_connector.domain.protocol import PROTOCOL_VERSION, AckStatus, XferReq
from ec_connector.domain.transfers import EventKind

from .conftest import Engine


def _kinds(eng: Engine) -> list[tuple[EventKind, str]]:
    return [(e.kind, e.mm_hash) for e in eng.events.events]


def test_an_entry_read_is_a_copy_that_changes_nothing_in_the_tier():
    eng = Engine()
    eng.step([("a", 2)])
    eng.settle()
    copy = eng.scheduler.entry("a")
    copy.pins += 5
    copy.grants[7] = 1e9
    assert eng.scheduler.entry("a").pins == 0 and eng.scheduler.entry("a").grants == {}
    assert [e.key for e in eng.scheduler.entries()] == ["a"] and eng.scheduler.entry("b") is None


def test_a_fetch_reserved_then_finished_is_ready_and_stored():
    eng = Engine()
    assert eng.scheduler.reserve_fetch("p", 3, now=0.0, lease_s=10.0) is not None
    assert eng.scheduler.holds("p") and not eng.scheduler.is_ready("p")
    eng.scheduler.finish_fetch("p")
    assert eng.scheduler.is_ready("p")
    assert _kinds(eng) == [(EventKind.STORED, "p")]


def test_a_failed_fetch_frees_or_quarantines_its_blocks_and_leaves_a_ready_entry_alone():
    eng = Engine(num_blocks=8)
    eng.scheduler.reserve_fetch("freed", 2, now=0.0, lease_s=10.0)
    eng.scheduler.reserve_fetch("held", 2, now=0.0, lease_s=10.0)
    assert eng.scheduler.fail_fetch("freed", now=0.0) is False
    assert not eng.scheduler.holds("freed")
    assert eng.scheduler.fail_fetch("held", now=0.0, quarantine_s=5.0) is True
    assert eng.scheduler.entry("held").phase is Phase.QUARANTINED
    assert eng.scheduler.occupancy().free_blocks == 6
    eng.step([("ready", 1)])
    eng.settle()
    assert eng.scheduler.fail_fetch("ready", now=0.0, quarantine_s=5.0) is False
    assert eng.scheduler.is_ready("ready")


def test_evict_takes_only_an_entry_nothing_holds():
    eng = Engine()
    eng.step([("a", 2)])
    eng.settle()
    eng.step([("a", 2)])  # a reload in flight pins it
    assert eng.scheduler.evict("a") is False
    eng.settle()
    assert eng.scheduler.evict("a") is True and eng.scheduler.evict("a") is False
    assert not eng.scheduler.holds("a") and eng.scheduler.stats.evictions == 1
    assert _kinds(eng)[-1] == (EventKind.EVICTED, "a")


def test_announce_skips_what_is_not_held_and_a_grant_is_released_once():
    eng = Engine(role=Role.PRODUCER)
    eng.step([("a", 2)])
    eng.settle()
    assert eng.scheduler.announce(["a", "absent"], lease_s=5.0) == {"a": 2 * eng.layout.block_size_bytes}
    assert eng.scheduler.evict("a") is False, "an announced entry is held"
    req = XferReq(PROTOCOL_VERSION, "a", "fp", "consumer-1")
    assert eng.scheduler.grant(req, fingerprint="other", lease_s=5.0) == (AckStatus.NACK_INCOMPAT, None)
    status, grant = eng.scheduler.grant(req, fingerprint="fp", lease_s=5.0)
    assert status is AckStatus.OK and grant is not None
    assert (grant.key, grant.holder, grant.rows) == ("a", "consumer-1", 2)
    assert grant.runs == eng.layout.byte_runs(eng.scheduler.entry("a").extents)
    assert eng.scheduler.entry("a").is_pinned
    assert eng.scheduler.release_grant("a", grant.grant_id) == grant
    assert eng.scheduler.release_grant("a", grant.grant_id) is None
    assert not eng.scheduler.entry("a").is_pinned


def test_a_lapsed_grant_reaches_the_listeners_once():
    eng = Engine(role=Role.PRODUCER)
    lapsed = []
    eng.scheduler.on_grant_lapsed(lapsed.append)
    eng.step([("a", 2)])
    eng.settle()
    _, grant = eng.scheduler.grant(XferReq(PROTOCOL_VERSION, "a", "fp", "c"), fingerprint="fp", lease_s=5.0)
    eng.clock.advance(5.0)
    eng.scheduler.poll()
    eng.scheduler.poll()
    assert lapsed == [grant]
    assert eng.scheduler.release_grant("a", grant.grant_id) is None, "a lapsed grant is not held"


def test_a_snapshot_takes_the_latencies_and_reads_the_occupancy():
    eng = Engine()
    eng.step([("a", 2)])
    eng.settle()
    first = eng.scheduler.snapshot()
    assert first.counters["saves_done"] == 1 and list(first.samples) == ["save"]
    assert first.occupancy.used_blocks == 2
    assert eng.scheduler.snapshot().samples == {}
