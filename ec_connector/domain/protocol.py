"""The P2P wire vocabulary, as plain values, and the rules both ends share.

The codec (msgspec) lives in an adapter; these are the values it carries. `RETRYABLE` is the one
definition of which statuses a consumer retries; everything else falls back to local encoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ec_connector.domain.entries import Entry, Phase

PROTOCOL_VERSION = 1
MAX_KEY_CHARS = 512
MAX_RUNS_PER_ACK = 4096


class AckStatus(str, Enum):
    OK = "OK"
    NACK_MISSING = "NACK_MISSING"
    NACK_NOT_READY = "NACK_NOT_READY"
    NACK_INCOMPAT = "NACK_INCOMPAT"
    NACK_VERSION = "NACK_VERSION"
    NACK_INTERNAL = "NACK_INTERNAL"


RETRYABLE: frozenset[AckStatus] = frozenset({AckStatus.NACK_NOT_READY})


class NextStep(Enum):
    READ = "read"
    RETRY = "retry"
    FALLBACK = "fallback"


def next_step(status: AckStatus) -> NextStep:
    """What a consumer does with an ack: read on OK, retry a RETRYABLE NACK, else fall back."""
    if status is AckStatus.OK:
        return NextStep.READ
    return NextStep.RETRY if status in RETRYABLE else NextStep.FALLBACK


@dataclass(frozen=True, slots=True)
class XferReq:
    """Consumer → producer: may I read `mm_hash`?"""

    version: int
    mm_hash: str
    fingerprint: str
    consumer: str
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class XferAck:
    """Producer → consumer. On OK: where the bytes are and how to reach the producer's agent.

    `runs` are (byte offset, byte length) pairs into the producer's registered region, one per
    contiguous extent, so an ack is O(entry), never O(region).
    """

    version: int
    mm_hash: str
    status: AckStatus
    size_bytes: int = 0
    rows: int = 0
    runs: tuple[tuple[int, int], ...] = ()
    grant_id: int = 0
    agent_name: str = ""
    agent_metadata: bytes = b""


@dataclass(frozen=True, slots=True)
class XferDone:
    """Consumer → producer: the READ under `grant_id` ended (releases the producer's pin)."""

    version: int
    mm_hash: str
    grant_id: int


def answer_status(req: XferReq, *, fingerprint: str, entry: Entry | None) -> AckStatus:
    """The producer's rule: version first, then compatibility, then what the table holds."""
    if req.version != PROTOCOL_VERSION:
        return AckStatus.NACK_VERSION
    if req.fingerprint != fingerprint:
        return AckStatus.NACK_INCOMPAT
    if entry is None or entry.phase is Phase.QUARANTINED:
        return AckStatus.NACK_MISSING
    if not fits_one_ack(entry):
        return AckStatus.NACK_INTERNAL
    if entry.phase is Phase.NOT_READY:
        return AckStatus.NACK_NOT_READY
    return AckStatus.OK


def fits_one_ack(entry: Entry) -> bool:
    """An entry spread over more extents than an ack may carry runs can never be served."""
    return len(entry.extents) <= MAX_RUNS_PER_ACK
