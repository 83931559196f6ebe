"""The control plane's wire codec and frame authentication (adapter code: msgspec is allowed here)."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ec_connector.adapters.zmq_control.auth import (
    ACK,
    REQUEST,
    TRAILER_BYTES,
    AuthFailure,
    FrameAuth,
    seal,
    unseal,
)
from ec_connector.adapters.zmq_control.codec import (
    MAX_FRAME_BYTES,
    FrameRejected,
    OversizedFrame,
    UnexpectedMessage,
    VersionMismatch,
    decode,
    decode_ack,
    decode_request,
    encode,
)
from ec_connector.domain.errors import ProtocolError
from ec_connector.domain.protocol import (
    MAX_KEY_CHARS,
    MAX_RUNS_PER_ACK,
    PROTOCOL_VERSION,
    AckStatus,
    XferAck,
    XferDone,
    XferReq,
)

REQ = XferReq(PROTOCOL_VERSION, "img-a", "f" * 64, "consumer-1", "req-1")
DONE = XferDone(PROTOCOL_VERSION, "img-a", 2**63)
ACK_OK = XferAck(
    version=PROTOCOL_VERSION,
    mm_hash="img-a",
    status=AckStatus.OK,
    size_bytes=7 * 7168,
    rows=7,
    runs=((0, 3 * 7168), (10 * 7168, 4 * 7168)),
    grant_id=12,
    agent_name="producer-0",
    agent_metadata=bytes(range(256)) * 32,
)


def raw(msg: object, version: object = PROTOCOL_VERSION, **extra: object) -> bytes:
    return msgspec.msgpack.encode({"version": version, "msg": msg, **extra})


def ack_body(**fields: object) -> dict:
    return {"type": "ack", "mm_hash": "img-a", "status": "OK", **fields}


# -- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message", [REQ, DONE, ACK_OK, XferAck(PROTOCOL_VERSION, "k", AckStatus.NACK_NOT_READY)]
)
def test_every_message_survives_the_round_trip_exactly(message: object) -> None:
    assert decode(encode(message)) == message


def test_a_frame_is_a_map_of_the_version_and_a_tagged_message() -> None:
    assert msgspec.msgpack.decode(encode(DONE)) == {
        "version": PROTOCOL_VERSION,
        "msg": {"type": "done", "mm_hash": "img-a", "grant_id": 2**63},
    }
    assert msgspec.msgpack.decode(encode(ACK_OK))["msg"]["status"] == "OK"


def test_decoded_statuses_are_the_domain_enum_and_runs_are_tuples() -> None:
    ack = decode_ack(encode(ACK_OK))
    assert ack.status is AckStatus.OK
    assert isinstance(ack.runs, tuple) and all(isinstance(run, tuple) for run in ack.runs)


def test_an_ack_with_agent_metadata_of_a_few_kib_is_far_below_the_frame_limit() -> None:
    big = XferAck(
        PROTOCOL_VERSION,
        "k" * MAX_KEY_CHARS,
        AckStatus.OK,
        agent_metadata=b"\xff" * 16384,
        runs=tuple((i * 8, 4) for i in range(MAX_RUNS_PER_ACK)),
    )
    assert decode(encode(big)) == big
    assert len(encode(big)) < MAX_FRAME_BYTES // 4


keys = st.text(min_size=1, max_size=MAX_KEY_CHARS)
counts = st.integers(min_value=0, max_value=2**64 - 1)


@settings(max_examples=200, deadline=None)
@given(
    key=keys,
    status=st.sampled_from(AckStatus),
    runs=st.lists(st.tuples(counts, st.integers(1, 2**64 - 1)), max_size=20).map(tuple),
    grant=counts,
    metadata=st.binary(max_size=4096),
    agent=st.text(max_size=64),
)
def test_any_valid_ack_round_trips(key, status, runs, grant, metadata, agent) -> None:
    ack = XferAck(PROTOCOL_VERSION, key, status, 5, 1, runs, grant, agent, metadata)
    assert decode_ack(encode(ack)) == ack


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_arbitrary_bytes_decode_or_raise_a_protocol_error(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode(data)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, len(encode(ACK_OK)) - 1))
def test_every_truncation_is_refused(cut: int) -> None:
    with pytest.raises(FrameRejected):
        decode(encode(ACK_OK)[:cut])


# -- refusals ------------------------------------------------------------------------------------

MALFORMED = {
    "garbage": b"\xc1\xc1\xc1",
    "empty": b"",
    "trailing bytes": encode(REQ) + b"\x00",
    "not a map": msgspec.msgpack.encode([PROTOCOL_VERSION, {}]),
    "no version": msgspec.msgpack.encode({"msg": {"type": "done", "mm_hash": "k", "grant_id": 1}}),
    "version not an int": raw({"type": "done", "mm_hash": "k", "grant_id": 1}, version="1"),
    "version a bool": raw({"type": "done", "mm_hash": "k", "grant_id": 1}, version=True),
    "no message": msgspec.msgpack.encode({"version": PROTOCOL_VERSION}),
    "unknown type": raw({"type": "push", "mm_hash": "k"}),
    "untagged": raw({"mm_hash": "k", "grant_id": 1}),
    "missing field": raw({"type": "req", "mm_hash": "k", "fingerprint": "f"}),
    "key of wrong type": raw({"type": "done", "mm_hash": b"k", "grant_id": 1}),
    "int as string": raw({"type": "done", "mm_hash": "k", "grant_id": "1"}),
    "float for int": raw({"type": "done", "mm_hash": "k", "grant_id": 1.0}),
    "empty key": raw({"type": "done", "mm_hash": "", "grant_id": 1}),
    "key too long": raw({"type": "done", "mm_hash": "k" * (MAX_KEY_CHARS + 1), "grant_id": 1}),
    "consumer too long": raw({"type": "req", "mm_hash": "k", "fingerprint": "f", "consumer": "c" * 513}),
    "unknown status": raw(ack_body(status="NACK_SOMETIMES")),
    "status lower case": raw(ack_body(status="ok")),
    "too many runs": raw(ack_body(runs=[[i, 1] for i in range(MAX_RUNS_PER_ACK + 1)])),
    "negative offset": raw(ack_body(runs=[[-1, 10]])),
    "negative length": raw(ack_body(runs=[[0, -10]])),
    "zero length": raw(ack_body(runs=[[0, 0]])),
    "run of three": raw(ack_body(runs=[[0, 1, 2]])),
    "negative size": raw(ack_body(size_bytes=-1)),
    "negative grant": raw({"type": "done", "mm_hash": "k", "grant_id": -5}),
    "metadata as text": raw(ack_body(agent_metadata="not bytes")),
    "nesting bomb": b"\x82\xa7version\x01\xa3msg" + b"\x91" * 200_000 + b"\x00",
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_frame_is_refused_with_a_protocol_error(name: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        decode(MALFORMED[name])
    assert type(refused.value) is FrameRejected and refused.value.reason == "malformed"
    assert str(refused.value)


def test_an_oversized_frame_is_refused_before_it_is_read() -> None:
    with pytest.raises(OversizedFrame, match=f"exceeds MAX_FRAME_BYTES={MAX_FRAME_BYTES}"):
        decode(b"\x00" * (MAX_FRAME_BYTES + 1))


def test_unknown_fields_of_this_version_are_ignored() -> None:
    frame = raw({"type": "done", "mm_hash": "k", "grant_id": 1, "hint": [1, 2]}, extra="x")
    assert decode(frame) == XferDone(PROTOCOL_VERSION, "k", 1)


@pytest.mark.parametrize(
    "msg, kind, key",
    [
        ({"type": "req", "mm_hash": "img-a", "fingerprint": {"v2": True}}, "req", "img-a"),
        ({"type": "req", "mm_hash": 7}, "req", ""),
        ({"type": ["odd"], "mm_hash": "img-a"}, "", "img-a"),
        ({"type": "req", "mm_hash": "k" * (MAX_KEY_CHARS + 1)}, "req", ""),
        ("opaque", "", ""),
        ([1, 2, 3], "", ""),
    ],
)
def test_another_version_is_read_only_as_far_as_its_version_kind_and_key(msg, kind, key) -> None:
    with pytest.raises(VersionMismatch) as mismatch:
        decode(raw(msg, version=PROTOCOL_VERSION + 1))
    assert (mismatch.value.version, mismatch.value.kind, mismatch.value.mm_hash) == (
        PROTOCOL_VERSION + 1,
        kind,
        key,
    )
    assert mismatch.value.reason == "version"
    assert f"protocol version {PROTOCOL_VERSION + 1}" in str(mismatch.value)


def test_our_own_message_of_another_version_is_encoded_for_tests_and_refused_on_decode() -> None:
    with pytest.raises(VersionMismatch):
        decode_request(encode(XferReq(PROTOCOL_VERSION + 1, "k", "f", "c")))


def test_each_end_accepts_only_the_kinds_it_is_sent() -> None:
    assert decode_request(encode(REQ)) == REQ
    assert decode_request(encode(DONE)) == DONE
    with pytest.raises(UnexpectedMessage):
        decode_request(encode(ACK_OK))
    for message in (REQ, DONE):
        with pytest.raises(UnexpectedMessage):
            decode_ack(encode(message))


@pytest.mark.parametrize(
    "message",
    [
        XferReq(PROTOCOL_VERSION, "", "f", "c"),
        XferReq(PROTOCOL_VERSION, "k" * (MAX_KEY_CHARS + 1), "f", "c"),
        XferDone(PROTOCOL_VERSION, "k", -1),
        XferAck(PROTOCOL_VERSION, "k", AckStatus.OK, runs=((5, 0),)),
        XferAck(PROTOCOL_VERSION, "k", "MAYBE"),  # type: ignore[arg-type]
        XferAck(PROTOCOL_VERSION, "k", AckStatus.OK, agent_metadata=b"x" * MAX_FRAME_BYTES),
    ],
)
def test_encoding_refuses_what_a_peer_would_refuse(message: object) -> None:
    with pytest.raises(FrameRejected):
        encode(message)


def test_encoding_something_else_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        encode("XferReq")  # type: ignore[arg-type]


# -- authentication ------------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_sealed_payload_opens_once_under_the_same_secret() -> None:
    clock = Clock()
    sender, receiver = FrameAuth("s3cret", clock=clock), FrameAuth(b"s3cret", clock=clock)
    parts = seal(sender, REQUEST, b"payload")
    assert len(parts) == 2 and len(parts[1]) == TRAILER_BYTES
    assert unseal(receiver, REQUEST, parts) == b"payload"
    with pytest.raises(AuthFailure, match="replay"):
        unseal(receiver, REQUEST, parts)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda p, t: (p + b"!", t),
        lambda p, t: (p, t[:-1] + bytes([t[-1] ^ 1])),
        lambda p, t: (p, t[:8] + bytes(16) + t[24:]),
        lambda p, t: (p, t[:-1]),
    ],
    ids=["payload", "mac", "nonce", "short trailer"],
)
def test_a_tampered_frame_fails(tamper) -> None:
    clock = Clock()
    payload, trailer = seal(FrameAuth("s3cret", clock=clock), REQUEST, b"payload")
    with pytest.raises(AuthFailure):
        unseal(FrameAuth("s3cret", clock=clock), REQUEST, list(tamper(payload, trailer)))


def test_a_frame_sealed_under_another_secret_or_direction_fails() -> None:
    clock = Clock()
    parts = seal(FrameAuth("one", clock=clock), REQUEST, b"payload")
    with pytest.raises(AuthFailure, match="another secret"):
        unseal(FrameAuth("two", clock=clock), REQUEST, parts)
    with pytest.raises(AuthFailure):
        unseal(FrameAuth("one", clock=clock), ACK, parts)


def test_frames_outside_the_window_fail_and_nonces_are_forgotten_after_it() -> None:
    clock = Clock()
    sender, receiver = FrameAuth("k", clock=clock), FrameAuth("k", window_s=30, clock=clock)
    parts = seal(sender, REQUEST, b"p")
    clock.now += 30.5
    with pytest.raises(AuthFailure, match="window"):
        unseal(receiver, REQUEST, parts)
    clock.now -= 61
    with pytest.raises(AuthFailure, match="window"):
        unseal(receiver, REQUEST, parts)
    clock.now += 30.5
    assert unseal(receiver, REQUEST, parts) == b"p"
    for _ in range(3):
        unseal(receiver, REQUEST, seal(sender, REQUEST, b"q"))
    clock.now += 31
    unseal(receiver, REQUEST, seal(sender, REQUEST, b"r"))
    assert len(receiver._seen) == 1, "nonces that can no longer be replayed are forgotten"


def test_sealing_must_match_on_both_ends() -> None:
    auth = FrameAuth("k")
    with pytest.raises(AuthFailure, match="unauthenticated"):
        unseal(auth, REQUEST, [b"p"])
    with pytest.raises(AuthFailure, match="no secret is configured here"):
        unseal(None, REQUEST, seal(auth, REQUEST, b"p"))
    with pytest.raises(FrameRejected, match="3 parts"):
        unseal(None, REQUEST, [b"p", b"q", b"r"])
    assert unseal(None, REQUEST, seal(None, REQUEST, b"p")) == b"p"


@pytest.mark.parametrize("secret, window", [("", 30.0), (b"", 30.0), ("k", 0.0)])
def test_an_empty_secret_or_window_is_refused(secret, window) -> None:
    with pytest.raises(ValueError):
        FrameAuth(secret, window_s=window)
