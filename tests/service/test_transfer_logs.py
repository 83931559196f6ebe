"""The canonical log lines of P2P transfers, as rendered by `configure_logging` through stdlib.

One INFO `peer_transfer` line per consumer fetch, whatever its outcome, and one INFO
`peer_grant_settled` line per producer grant; lines carry their context (role, engine id, item,
request, peer) and JSON mode renders parseable JSON. Runs the P2P services over the in-memory
adapters with a manual clock, so durations are exact.
"""

from __future__ import annotations

import json
import logging

import pytest
import structlog

from ec_connector import logging as ec_logging
from ec_connector.domain.protocol import AckStatus

from .test_p2p import ADDR, Pair, _answering

PEER = f"{ADDR.host}:{ADDR.port}"


class _Lines(logging.Handler):
    """Records what reaches the stdlib logger `ec_connector` (what vLLM's handlers would print)."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def json(self, event: str | None = None) -> list[dict]:
        out = [json.loads(r.getMessage()) for r in self.records]
        return [e for e in out if event is None or e["event"] == event]


@pytest.fixture
def lines(monkeypatch):
    """Logging configured as in an engine; JSON unless a test reconfigures it."""
    saved = structlog.get_config()
    monkeypatch.setattr(ec_logging, "_configured", None)
    root = logging.getLogger("ec_connector")
    level = root.level
    handler = _Lines()
    root.addHandler(handler)
    ec_logging.configure_logging(json=True)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        structlog.configure(**saved)


def _transfer(lines: _Lines) -> dict:
    found = lines.json("peer_transfer")
    assert len(found) == 1, f"exactly one canonical line per fetch, got {found}"
    return found[0]


def test_a_read_logs_one_line_with_bytes_runs_and_timings(lines):
    pair = Pair()
    params = pair.produce([("img", 6)])
    assert pair.fetch(params, [("img", 6)], request_id="req-7") is False
    pair.clock.advance(0.25)
    assert pair.run_until_available(params, [("img", 6)], request_id="req-7")
    for _ in range(3):
        pair.fetch(params, [("img", 6)], request_id="req-7")  # ready: no second line
    line = _transfer(lines)
    assert line["level"] == "info"
    assert {k: line[k] for k in ("mm_hash", "request_id", "peer", "outcome", "role", "engine_id")} == {
        "mm_hash": "img",
        "request_id": "req-7",
        "peer": PEER,
        "outcome": "read",
        "role": "ec_consumer",
        "engine_id": "cons",
    }
    assert line["bytes"] == 6 * pair.consumer.layout.block_size_bytes
    assert line["runs"] >= 1 and line["asked"] == 1
    assert line["ack_ms"] == 250.0, "the ack was applied on the poll after the clock moved"
    assert line["read_ms"] >= 0 and line["total_ms"] == line["ack_ms"] + line["read_ms"]
    assert "reason" not in line


def test_the_producer_logs_one_line_per_grant_settled_by_done(lines):
    pair = Pair()
    params = pair.produce([("img", 6)])
    assert pair.run_until_available(params, [("img", 6)])
    granted = lines.json("peer_grant_settled")
    assert len(granted) == 1
    line = granted[0]
    assert line["outcome"] == "done" and line["level"] == "info"
    assert line["mm_hash"] == "img" and line["peer"] == "cons" and line["grant"] >= 1
    assert line["role"] == "ec_producer" and line["engine_id"] == "engine-a"
    assert line["bytes"] == params["img"]["size_bytes"]
    assert line["runs"] == _transfer(lines)["runs"]


def test_a_grant_nobody_releases_logs_its_lease_lapse(lines):
    pair = Pair(producer_pin_lease_s=30.0)
    params = pair.produce([("img", 4)])
    pair.world.stalled.add("prod")
    pair.fetch(params, [("img", 4)])
    pair.fetch(params, [("img", 4)])  # granted: the READ hangs
    pair.clock.advance(30.0)
    pair.producer.scheduler.poll()
    [line] = lines.json("peer_grant_settled")
    assert line["outcome"] == "lease_lapsed" and line["held_ms"] == 30000.0
    assert line["mm_hash"] == "img" and line["peer"] == "cons"
    # the consumer's late XferDone (after its READ timeout) logs nothing more
    pair.clock.advance(30.0)
    pair.fetch(params, [("img", 4)])
    assert len(lines.json("peer_grant_settled")) == 1


@pytest.mark.parametrize("status", [AckStatus.NACK_MISSING, AckStatus.NACK_INCOMPAT])
def test_a_nack_logs_a_fallback_with_its_status_as_reason(lines, status):
    pair = Pair()
    params = pair.produce([("img", 4)])
    _answering(pair, status)
    assert pair.run_until_available(params, [("img", 4)])
    line = _transfer(lines)
    assert line["outcome"] == "fallback" and line["reason"] == status.value
    assert line["request_id"] == "r1" and line["peer"] == PEER and line["mm_hash"] == "img"
    assert "ack_ms" in line and "read_ms" not in line and line["runs"] == 0


def test_an_ack_timeout_logs_a_fallback_without_ack_time(lines):
    pair = Pair(consumer_ack_timeout_s=2.0)
    params = pair.produce([("img", 4)])
    pair.net.silenced.add(ADDR)
    pair.fetch(params, [("img", 4)])
    pair.clock.advance(2.5)
    assert pair.fetch(params, [("img", 4)]) is True
    line = _transfer(lines)
    assert (line["outcome"], line["reason"], line["total_ms"]) == ("fallback", "ack_timeout", 2500.0)
    assert "ack_ms" not in line and "read_ms" not in line


def test_a_read_timeout_logs_its_read_time(lines):
    pair = Pair(read_timeout_s=20.0)
    params = pair.produce([("img", 4)])
    pair.world.stalled.add("prod")
    pair.fetch(params, [("img", 4)])
    pair.fetch(params, [("img", 4)])  # the READ starts
    pair.clock.advance(20.0)
    assert pair.fetch(params, [("img", 4)]) is True
    line = _transfer(lines)
    assert (line["outcome"], line["reason"], line["read_ms"]) == ("fallback", "read_timeout", 20000.0)
    assert line["runs"] >= 1


def test_not_ready_retries_are_counted_on_the_one_line(lines):
    pair = Pair(producer_hold=True, not_ready_backoff_s=0.1, not_ready_backoff_max_s=0.1)
    params = pair.produce([("img", 5)], settle=False)
    for _ in range(5):  # an ask answered NACK_NOT_READY is held until the next poll
        pair.fetch(params, [("img", 5)])
        pair.clock.advance(0.15)
    pair.producer.settle()
    assert pair.run_until_available(params, [("img", 5)], steps=20)
    line = _transfer(lines)
    assert line["outcome"] == "read" and line["asked"] >= 3


def test_an_item_without_media_that_cannot_be_fetched_logs_unavailable(lines):
    pair = Pair()
    params = pair.produce([("img", 4)])
    pair.net.silenced.add(ADDR)
    pair.fetch(params, [("img", 4)], request_id="r-meta", media=False)
    pair.clock.advance(3.0)
    pair.fetch(params, [("img", 4)], request_id="r-meta", media=False)
    line = _transfer(lines)
    assert (line["outcome"], line["reason"]) == ("unavailable", "ack_timeout")
    assert line["failed_requests"] == ["r-meta"]


def test_a_full_region_logs_a_fallback_without_asking(lines):
    pair = Pair()
    params = pair.produce([("img", 4)])
    pair.consumer.scheduler.reserve_fetch(  # a fetch in flight holds every block
        "filler", pair.consumer.layout.num_blocks, now=pair.clock.now(), lease_s=60.0
    )
    assert pair.fetch(params, [("img", 4)]) is True
    line = _transfer(lines)
    assert (line["outcome"], line["reason"], line["asked"]) == ("fallback", "region_full", 0)
    assert pair.consumer_stats.requests_sent == 0


def test_lines_inside_a_fetch_carry_its_bound_context(lines):
    pair = Pair()
    params = pair.produce([("img", 4)])
    params["img"]["size_bytes"] += 1  # the consumer refuses the params' size
    assert pair.fetch(params, [("img", 4)], request_id="req-9") is True
    [line] = lines.json("transfer_size_mismatch")
    assert line["level"] == "warning"
    assert (line["mm_hash"], line["request_id"], line["role"], line["engine_id"]) == (
        "img",
        "req-9",
        "ec_consumer",
        "cons",
    ), "bound with log_context at the fetch's start, not passed at the call"
    assert lines.json("peer_transfer") == [], "no fetch started: no canonical line"


def test_default_rendering_is_one_logfmt_line_event_first(lines):
    ec_logging.configure_logging(json=False)
    pair = Pair()
    params = pair.produce([("img", 6)])
    assert pair.run_until_available(params, [("img", 6)], request_id="req-1")
    [text] = [r.getMessage() for r in lines.records if "peer_transfer" in r.getMessage()]
    assert text.startswith("event=peer_transfer ")
    assert "\n" not in text
    for field in ("mm_hash=img", "request_id=req-1", f"peer={PEER}", "outcome=read", "bytes=", "total_ms="):
        assert field in text


def test_debug_lines_of_the_local_tier_are_per_batch_and_off_at_info(lines):
    pair = Pair()
    pair.producer.step([("a", 2), ("b", 3)])
    pair.producer.settle()
    assert [r for r in lines.records if r.levelno < logging.INFO] == []
    ec_logging.configure_logging(json=True, level="DEBUG")
    pair.producer.step([("c", 2), ("d", 3)])
    pair.producer.settle()
    batches = lines.json("tier_offload_batch")
    assert [(b["entries"], b["rows"]) for b in batches] == [(2, 5)]
    assert [(c["saves"], c["loads"]) for c in lines.json("tier_copies_completed")] == [(2, 0)]
