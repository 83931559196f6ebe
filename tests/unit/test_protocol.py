"""Wire vocabulary: what a consumer does with each ack; how a producer answers."""

from __future__ import annotations

import dataclasses

import pytest

from ec_connector.domain.blocks import Extent
from ec_connector.domain.entries import Entry
from ec_connector.domain.protocol import (
    MAX_RUNS_PER_ACK,
    PROTOCOL_VERSION,
    RETRYABLE,
    AckStatus,
    NextStep,
    XferAck,
    XferReq,
    answer_status,
    next_step,
)

FP = "f" * 64


def _req(version: int = PROTOCOL_VERSION, fingerprint: str = FP) -> XferReq:
    return XferReq(version=version, mm_hash="img", fingerprint=fingerprint, consumer="c0")


def _entry(phase: str) -> Entry:
    entry = Entry(key="img", extents=(Extent(0, 2),), rows=2, ready_deadline=5.0)
    if phase == "ready":
        entry.mark_ready()
    elif phase == "quarantined":
        entry.quarantine(until=60.0)
    return entry


def test_ack_statuses_are_exactly_the_spec_vocabulary():
    assert {s.value for s in AckStatus} == {
        "OK",
        "NACK_MISSING",
        "NACK_NOT_READY",
        "NACK_INCOMPAT",
        "NACK_VERSION",
        "NACK_INTERNAL",
    }
    assert AckStatus("NACK_NOT_READY") is AckStatus.NACK_NOT_READY


def test_only_not_ready_is_retryable():
    assert frozenset({AckStatus.NACK_NOT_READY}) == RETRYABLE


@pytest.mark.parametrize(
    ("status", "step"),
    [
        (AckStatus.OK, NextStep.READ),
        (AckStatus.NACK_NOT_READY, NextStep.RETRY),
        (AckStatus.NACK_MISSING, NextStep.FALLBACK),
        (AckStatus.NACK_INCOMPAT, NextStep.FALLBACK),
        (AckStatus.NACK_VERSION, NextStep.FALLBACK),
        (AckStatus.NACK_INTERNAL, NextStep.FALLBACK),
    ],
)
def test_next_step_for_every_status(status, step):
    assert next_step(status) is step


def test_every_status_has_a_next_step():
    assert {next_step(s) for s in AckStatus} == set(NextStep)


def test_version_mismatch_is_answered_before_anything_else():
    req = _req(version=PROTOCOL_VERSION + 1, fingerprint="other")
    assert answer_status(req, fingerprint=FP, entry=None) is AckStatus.NACK_VERSION
    assert answer_status(req, fingerprint=FP, entry=_entry("ready")) is AckStatus.NACK_VERSION


def test_fingerprint_mismatch_is_answered_before_table_state():
    req = _req(fingerprint="other")
    for entry in (None, _entry("ready"), _entry("not_ready"), _entry("quarantined")):
        assert answer_status(req, fingerprint=FP, entry=entry) is AckStatus.NACK_INCOMPAT


def test_missing_entry_is_answered_nack_missing():
    assert answer_status(_req(), fingerprint=FP, entry=None) is AckStatus.NACK_MISSING


def test_quarantined_entry_is_answered_nack_missing():
    assert answer_status(_req(), fingerprint=FP, entry=_entry("quarantined")) is AckStatus.NACK_MISSING


def test_entry_whose_save_has_not_landed_is_answered_nack_not_ready():
    assert answer_status(_req(), fingerprint=FP, entry=_entry("not_ready")) is AckStatus.NACK_NOT_READY


def test_ready_entry_is_answered_ok():
    assert answer_status(_req(), fingerprint=FP, entry=_entry("ready")) is AckStatus.OK


def test_pinned_ready_entry_is_still_answered_ok():
    entry = _entry("ready")
    entry.pin()
    entry.grant(1, deadline=9.0)
    assert answer_status(_req(), fingerprint=FP, entry=entry) is AckStatus.OK


@pytest.mark.parametrize("phase", ["ready", "not_ready"])
def test_entry_spread_over_more_extents_than_an_ack_carries_is_answered_nack_internal(phase):
    for extents, status in ((MAX_RUNS_PER_ACK, None), (MAX_RUNS_PER_ACK + 1, AckStatus.NACK_INTERNAL)):
        entry = Entry(
            key="img",
            extents=tuple(Extent(2 * i, 1) for i in range(extents)),
            rows=extents,
            ready_deadline=5.0,
        )
        if phase == "ready":
            entry.mark_ready()
        got = answer_status(_req(), fingerprint=FP, entry=entry)
        assert got is (status or (AckStatus.OK if phase == "ready" else AckStatus.NACK_NOT_READY))


def test_messages_are_frozen_values():
    ack = XferAck(version=PROTOCOL_VERSION, mm_hash="img", status=AckStatus.OK, runs=((0, 64),))
    assert ack.runs == ((0, 64),)
    assert (ack.grant_id, ack.size_bytes, ack.agent_metadata) == (0, 0, b"")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ack.status = AckStatus.NACK_MISSING  # type: ignore[misc]
    assert _req() == _req()
