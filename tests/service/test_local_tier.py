"""Local-tier flows of the scheduler and worker services, over the in-memory adapters."""

from __future__ import annotations

import random

import pytest

from ec_connector.domain.blocks import Extent
from ec_connector.domain.config import Role
from ec_connector.domain.entries import Phase
from ec_connector.domain.transfers import EventKind

from .conftest import Engine, HostPayload, encoder_output


def test_offloaded_item_becomes_ready_only_when_its_save_completes():
    eng = Engine(hold=True)
    eng.step([("img-a", 3)])
    assert eng.scheduler.entry("img-a").phase is Phase.NOT_READY
    assert eng.scheduler.has_pending_work()
    assert not eng.scheduler.has_item("img-a")
    eng.settle()
    assert eng.scheduler.entry("img-a").phase is Phase.READY
    assert not eng.scheduler.has_pending_work()
    assert [(e.kind, e.mm_hash, e.size_bytes) for e in eng.events.events] == [
        (EventKind.STORED, "img-a", 3 * eng.layout.block_size_bytes)
    ]
    assert eng.scheduler.stats.saves_done == 1
    assert eng.scheduler.stats.bytes_saved == 3 * eng.layout.block_size_bytes


def test_reload_returns_the_saved_bytes_and_skips_the_encoder():
    eng = Engine()
    first = eng.step([("img-a", 5), ("img-b", 2)])
    eng.settle()
    second = eng.step([("img-a", 5), ("img-c", 1)])
    eng.settle()
    assert first.encoded == ["img-a", "img-b"]
    assert second.encoded == ["img-c"]
    assert second.loaded["img-a"] == encoder_output("img-a", 5)
    assert eng.scheduler.stats.hits == 1 and eng.scheduler.stats.loads_done == 1


def test_reloaded_entry_is_unpinned_only_after_every_rank_completes():
    eng = Engine(ranks=2, hold=True)
    eng.step([("img-a", 2)])
    eng.settle()
    eng.step([("img-a", 2)])
    assert eng.scheduler.entry("img-a").pins == 1
    eng.copiers[0].release_held()
    eng.workers[0].flush()
    eng.scheduler.poll()
    assert eng.scheduler.entry("img-a").pins == 1, "rank 1 has not finished its load yet"
    eng.copiers[1].release_held()
    eng.workers[1].flush()
    eng.scheduler.poll()
    assert eng.scheduler.entry("img-a").pins == 0
    assert not eng.scheduler.has_pending_work()


def test_only_the_writer_rank_saves():
    eng = Engine(ranks=2)
    eng.step([("img-a", 2)])
    eng.settle()
    assert eng.copiers[0].saved and not eng.copiers[1].saved
    assert eng.scheduler.is_ready("img-a")


def test_every_rank_loads():
    eng = Engine(ranks=3)
    eng.step([("img-a", 2)])
    eng.settle()
    eng.step([("img-a", 2)])
    eng.settle()
    assert all(len(c.loaded) == 1 for c in eng.copiers)
    assert eng.scheduler.stats.loads_done == 1


def test_eviction_under_pressure_is_fifo_and_announced_as_events():
    eng = Engine(num_blocks=10, min_run_bytes=0)  # d takes the slivers: no run floor
    for key in ("a", "b", "c"):
        eng.step([(key, 3)])
        eng.settle()
    eng.step([("d", 4)])
    eng.settle()
    evicted = [e.mm_hash for e in eng.events.events if e.kind is EventKind.EVICTED]
    assert evicted == ["a"]
    assert not eng.scheduler.entry("a")
    assert all(eng.scheduler.is_ready(k) for k in ("b", "c", "d"))
    assert eng.scheduler.stats.evictions == 1


def test_the_run_floor_evicts_one_more_oldest_entry_counts_it_and_announces_it():
    eng = Engine(num_blocks=10)  # the default floor (256 KiB) is longer than this whole region
    for key in ("a", "b", "c"):
        eng.step([(key, 3)])
        eng.settle()
    eng.step([("d", 4)])  # a's 3 blocks and the last free one are apart: b goes too
    eng.settle()
    evicted = [e.mm_hash for e in eng.events.events if e.kind is EventKind.EVICTED]
    assert evicted == ["a", "b"]
    assert eng.scheduler.entry("d").extents == (Extent(0, 4),)
    assert eng.scheduler.stats.evictions == 2
    assert eng.scheduler.stats.evictions_for_runs == 1


def test_region_full_of_pinned_entries_means_the_item_is_simply_not_offloaded():
    eng = Engine(num_blocks=6, hold=True)
    eng.step([("a", 3), ("b", 3)])
    eng.settle()
    eng.step([("a", 3), ("b", 3)])  # both reloading: pinned until the loads end
    result = eng.step([("c", 2)])
    assert result.encoded == ["c"]
    assert not eng.scheduler.holds("c")
    assert eng.scheduler.stats.not_offloaded == 1
    assert eng.scheduler.stats.evictions == 0
    assert not [e for e in eng.events.events if e.kind is EventKind.EVICTED]


def test_item_larger_than_the_region_is_not_offloaded_and_evicts_nothing():
    eng = Engine(num_blocks=8)
    eng.step([("a", 4)])
    eng.settle()
    eng.step([("huge", 9)])
    assert eng.scheduler.is_ready("a")
    assert eng.scheduler.stats.not_offloaded == 1


def test_item_promised_to_vllm_is_not_evicted_by_the_same_step():
    eng = Engine(num_blocks=6)
    eng.step([("a", 3)])
    eng.settle()
    eng.step([("b", 3)])
    eng.settle()
    # 'a' is oldest; the step reloads it and offloads 'c', which needs room: 'b' must go, not 'a'.
    result = eng.step([("a", 3), ("c", 3)])
    eng.settle()
    assert result.loaded["a"] == encoder_output("a", 3)
    assert [e.mm_hash for e in eng.events.events if e.kind is EventKind.EVICTED] == ["b"]


def test_payload_that_does_not_match_the_layout_is_dropped_and_nothing_written():
    eng = Engine()
    bad = HostPayload("float32", 2, 4, b"\0" * 32)
    before = bytes(eng.region.data())
    eng.step([("img-a", 2)], payloads={"img-a": bad})
    eng.scheduler.poll()
    assert not eng.scheduler.holds("img-a")
    assert bytes(eng.region.data()) == before
    assert eng.scheduler.stats.saves_failed == 1
    assert eng.scheduler.occupancy().free_blocks == eng.layout.num_blocks


def test_one_bad_payload_fails_only_its_own_save_in_a_batch():
    eng = Engine()
    bad = HostPayload("float32", 2, 4, b"\0" * 32)
    eng.step([("img-a", 2), ("img-b", 2), ("img-c", 3)], payloads={"img-b": bad})
    eng.scheduler.poll()
    assert not eng.scheduler.holds("img-b")
    assert eng.scheduler.stats.saves_failed == 1
    assert eng.step([("img-a", 2), ("img-c", 3)]).loaded == {
        "img-a": encoder_output("img-a", 2),
        "img-c": encoder_output("img-c", 3),
    }


def test_producer_role_never_reloads_and_consumer_role_never_offloads():
    producer = Engine(role=Role.PRODUCER)
    producer.step([("a", 2)])
    producer.settle()
    assert producer.scheduler.is_ready("a")
    assert not producer.scheduler.has_item("a")
    assert producer.step([("a", 2)]).encoded == ["a"]

    consumer = Engine(role=Role.CONSUMER)
    consumer.step([("a", 2)])
    consumer.settle()
    assert not consumer.scheduler.holds("a")
    assert not consumer.copiers[0].saved


def test_save_that_never_completes_is_quarantined_then_reclaimed():
    eng = Engine(hold=True, save_lease_s=5.0, quarantine_s=7.0)
    eng.step([("a", 4)])
    eng.clock.advance(5.0)
    eng.scheduler.poll()
    assert eng.scheduler.entry("a").phase is Phase.QUARANTINED
    assert eng.scheduler.stats.save_leases_lapsed == 1
    assert not eng.scheduler.has_pending_work()
    eng.clock.advance(7.0)
    eng.scheduler.poll()
    assert not eng.scheduler.holds("a")
    assert eng.scheduler.occupancy().free_blocks == eng.layout.num_blocks
    # the late completion is ignored, not applied to whatever holds those blocks now
    eng.settle()
    assert eng.scheduler.stats.saves_done == 0


def test_same_item_twice_in_one_step_is_saved_once():
    eng = Engine()
    eng.step([("a", 2), ("a", 2)])
    eng.settle()
    assert eng.copiers[0].saved == [1]
    assert eng.scheduler.stats.saves_planned == 1


def test_item_whose_save_is_in_flight_is_neither_reloaded_nor_saved_again():
    eng = Engine(hold=True)
    eng.step([("a", 2)])
    result = eng.step([("a", 2)])
    assert result.encoded == ["a"]
    assert eng.scheduler.stats.saves_planned == 1
    eng.settle()
    assert eng.scheduler.is_ready("a")
    # the repeat was a miss on an entry still saving; an item never seen is a plain miss
    eng.step([("a", 2), ("b", 1)])
    stats = eng.scheduler.stats
    assert (stats.hits, stats.misses, stats.misses_saving) == (1, 3, 1)


def test_occupancy_reports_blocks_and_bytes():
    eng = Engine(num_blocks=16)
    eng.step([("a", 3), ("b", 5)])
    eng.settle()
    occ = eng.scheduler.occupancy()
    assert (occ.entries, occ.used_blocks, occ.free_blocks) == (2, 8, 8)
    assert occ.used_bytes == 8 * eng.layout.block_size_bytes
    assert occ.capacity_bytes == eng.layout.data_bytes


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_many_steps_with_repeats_leave_no_pins_and_conserve_blocks(ranks):
    eng = Engine(num_blocks=20, ranks=ranks)
    rng = random.Random(7)
    keys = [f"img-{rng.randrange(13)}" for _ in range(120)]
    for i in range(0, len(keys), 3):
        batch = [(k, 1 + int(k.split("-")[1]) % 5) for k in keys[i : i + 3]]
        result = eng.step(batch)
        for key, payload in result.loaded.items():
            rows = 1 + int(key.split("-")[1]) % 5
            assert payload == encoder_output(key, rows)
        eng.settle()
    entries = eng.scheduler.entries()
    assert all(e.pin_count == 0 for e in entries)
    used = sum(e.rows for e in entries)
    assert used + eng.scheduler.occupancy().free_blocks == eng.layout.num_blocks
    assert not eng.scheduler.has_pending_work()
    assert eng.scheduler.stats.hits > 0 and eng.scheduler.stats.evictions > 0


def test_a_save_batch_the_copier_rejects_fails_its_entries_instead_of_the_step():
    eng = Engine()
    copier = eng.copiers[0]
    real_save = copier.save

    def reject(jobs):
        from ec_connector.domain.errors import LayoutMismatch

        raise LayoutMismatch("extents beyond the region")

    copier.save = reject  # type: ignore[method-assign]
    eng.step([("a", 2), ("b", 3)])
    eng.scheduler.poll()
    copier.save = real_save  # type: ignore[method-assign]
    assert eng.scheduler.occupancy().entries == 0
    assert eng.scheduler.stats.saves_failed == 2
    assert eng.scheduler.occupancy().free_blocks == eng.layout.num_blocks


def test_copies_that_end_between_steps_are_reported_without_another_hook():
    # vLLM runs no worker hook in an idle step: the watcher must report what ends meanwhile.
    import time

    eng = Engine(hold=True)
    eng.step([("a", 2), ("b", 3)])
    assert eng.scheduler.has_pending_work()
    eng.copiers[0].release_held()  # the copies end; no hook runs
    deadline = time.monotonic() + 5.0
    while eng.scheduler.has_pending_work() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not eng.scheduler.has_pending_work()
    assert eng.scheduler.is_ready("a") and eng.scheduler.is_ready("b")
    for worker in eng.workers:
        worker.close()
    assert all(w._watcher is None or not w._watcher.is_alive() for w in eng.workers)


def test_the_watcher_leaves_the_copier_alone_while_steps_keep_flushing():
    # Each poll the watcher makes takes the GIL and the worker's lock from the step thread; while the
    # step thread flushes at least once per interval, it reports ends itself and the watcher waits.
    import threading
    import time

    eng = Engine(hold=True)
    worker, copier = eng.workers[0], eng.copiers[0]
    worker._watch_interval_s = 0.1
    step_thread = threading.get_ident()
    pollers: list[int] = []
    real_poll = copier.poll

    def poll() -> list[int]:
        pollers.append(threading.get_ident())
        return real_poll()

    copier.poll = poll  # type: ignore[method-assign]
    eng.step([("a", 2)])  # a save in flight: the flush wakes the watcher
    until = time.monotonic() + 0.5
    while time.monotonic() < until:  # steps twenty times as often as the interval
        worker.flush()
        time.sleep(0.005)
    by_watcher = [t for t in pollers if t != step_thread]
    assert len(by_watcher) <= 2, f"the watcher polled {len(by_watcher)} times between flushes"
    copier.release_held()  # then the engine goes idle: the watcher reports the end alone
    deadline = time.monotonic() + 5.0
    while eng.scheduler.has_pending_work() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert eng.scheduler.is_ready("a")
    assert len([t for t in pollers if t != step_thread]) > len(by_watcher)  # the watcher reported it
    worker.close()


def test_a_step_that_reports_the_last_copy_itself_puts_the_watcher_to_sleep():
    eng = Engine(hold=True)
    worker = eng.workers[0]
    worker._watch_interval_s = 0.5
    eng.step([("a", 2)])  # in flight: the flush woke the watcher
    assert worker._wake.is_set()
    eng.copiers[0].release_held()
    worker.flush()  # the next step reports the end before the watcher's interval is up
    eng.scheduler.poll()
    assert eng.scheduler.is_ready("a")
    assert not worker._wake.is_set()  # nothing in flight: no wake-ups until copies start again
    worker.close()


def test_worker_close_reports_copies_still_in_flight():
    eng = Engine(hold=True)
    eng.step([("a", 2)])
    eng.workers[0].close()
    eng.scheduler.poll()
    assert eng.scheduler.is_ready("a")
