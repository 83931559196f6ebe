"""Fuzzing what a peer controls: control frames (codec + auth), the NIXL metadata envelope that an
ack carries, and the `ec_transfer_params` a request carries.

Every input either decodes or raises the documented error (`FrameRejected`, a `ProtocolError`,
with a drop `reason`; `ValueError` naming the peer for the envelope; `ProtocolError` for params),
never anything else. What a decoder accepts must also be what the other end can send: a decoded
message re-encodes to a frame that decodes to the same message.
"""

from __future__ import annotations

import msgspec
from conftest import FUZZ, batch, count
from hypothesis import example, given
from hypothesis import strategies as st

from ec_connector.adapters.nixl_data import wire
from ec_connector.adapters.zmq_control.auth import ACK, REQUEST, AuthFailure, FrameAuth, unseal
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
from ec_connector.adapters.zmq_control.sockets import DROP_REASONS
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
from ec_connector.domain.publish import PeerRef, parse_transfer_params

# -- strategies ----------------------------------------------------------------------------------

u64 = st.integers(0, 2**64 - 1)
text = st.text(max_size=40)
key = st.text(min_size=1, max_size=40) | st.just("k" * MAX_KEY_CHARS)
messages = st.one_of(
    st.builds(XferReq, st.just(PROTOCOL_VERSION), key, text, text, text),
    st.builds(XferDone, st.just(PROTOCOL_VERSION), key, u64),
    st.builds(
        XferAck,
        version=st.just(PROTOCOL_VERSION),
        mm_hash=text,
        status=st.sampled_from(AckStatus),
        size_bytes=u64,
        rows=u64,
        runs=st.lists(st.tuples(u64, st.integers(1, 2**64 - 1)), max_size=8).map(tuple),
        grant_id=u64,
        agent_name=text,
        agent_metadata=st.binary(max_size=64),
    ),
)

# msgpack values a hostile peer can put anywhere in a frame
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
FIELDS = (
    "type",
    "mm_hash",
    "fingerprint",
    "consumer",
    "request_id",
    "status",
    "size_bytes",
    "rows",
    "runs",
    "grant_id",
    "agent_name",
    "agent_metadata",
)
plausible_bodies = st.fixed_dictionaries(
    {"type": st.sampled_from(["req", "ack", "done", "evil", ""]) | msgpack_values},
    optional={
        name: msgpack_values
        | st.sampled_from([s.value for s in AckStatus])
        | st.lists(st.tuples(u64, u64), max_size=3)
        | st.just("k" * (MAX_KEY_CHARS + 1))
        for name in FIELDS[1:]
    },
)
versions = st.sampled_from([PROTOCOL_VERSION, PROTOCOL_VERSION + 1, 0, -1, 2**64 - 1]) | msgpack_values


_EDITS = st.lists(
    st.tuples(
        st.sampled_from(["flip", "set", "insert", "delete", "dup", "truncate"]),
        st.floats(0, 1, exclude_max=True),  # where, as a fraction of the current length
        st.integers(0, 7),
        st.sampled_from([0x00, 0x7F, 0x80, 0xC0, 0xC1, 0xD9, 0xDC, 0xDD, 0xDF, 0xFF]),
        st.binary(min_size=1, max_size=8),
        st.integers(1, 16),
    ),
    min_size=1,
    max_size=4,
)


def _apply(frame: bytes, edits: list[tuple]) -> bytes:
    """A frame with a few bytes flipped, set, inserted, deleted, duplicated, or cut short.

    Edits are drawn independently of the frame (positions are fractions), so the data drawn
    never depends on earlier draws' values.
    """
    data = bytearray(frame)
    for op, where, bit, value, insert, span in edits:
        at = int(where * len(data))
        if op == "flip" and data:
            data[at] ^= 1 << bit
        elif op == "set" and data:
            data[at] = value
        elif op == "insert":
            data[at:at] = insert
        elif op == "delete" and data:
            del data[at : at + span]
        elif op == "dup" and data:
            data[at:at] = data[at : at + span]
        elif op == "truncate":
            data = data[:at]
    return bytes(data)


def mutated(frames: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.tuples(frames, _EDITS).map(lambda pair: _apply(*pair))


valid_frames = messages.map(encode)


# -- the checks ----------------------------------------------------------------------------------


def check_decoders(frame: bytes) -> None:
    """decode / decode_request / decode_ack: a message, or FrameRejected with a counted reason."""
    try:
        message = decode(frame)
    except FrameRejected as err:
        assert err.reason in DROP_REASONS, err.reason
        assert str(err), "a rejection says why"
        if isinstance(err, VersionMismatch):
            assert err.version != PROTOCOL_VERSION
            assert isinstance(err.kind, str) and len(err.kind) <= 16
            assert isinstance(err.mm_hash, str) and len(err.mm_hash) <= MAX_KEY_CHARS
        if isinstance(err, OversizedFrame):
            assert len(frame) > MAX_FRAME_BYTES
        for narrower in (decode_request, decode_ack):  # the same refusal at either end
            try:
                narrower(frame)
            except FrameRejected as again:
                assert type(again) is type(err)
            else:
                raise AssertionError(f"{narrower.__name__} accepted what decode refused") from None
        return
    assert isinstance(message, (XferReq, XferAck, XferDone))
    assert message.version == PROTOCOL_VERSION
    if isinstance(message, XferAck):
        assert isinstance(message.status, AckStatus)
        assert len(message.runs) <= MAX_RUNS_PER_ACK
        assert all(off >= 0 and n >= 1 for off, n in message.runs)
    else:
        assert 0 < len(message.mm_hash) <= MAX_KEY_CHARS
    # what one end accepts, the other can send, unchanged
    assert decode(encode(message)) == message
    server_side, client_side = isinstance(message, (XferReq, XferDone)), isinstance(message, XferAck)
    for narrower, accepts in ((decode_request, server_side), (decode_ack, client_side)):
        try:
            assert narrower(frame) == message and accepts
        except UnexpectedMessage:
            assert not accepts


@FUZZ
@given(batch(st.binary(max_size=512)))
@example([b""])
@example([b"\x82\xa7version\x01\xa3msg" + b"\x91" * 100_000 + b"\x00"])  # nesting bomb
def test_codec_arbitrary_bytes(frames: list[bytes]) -> None:
    for frame in frames:
        count("codec: arbitrary bytes")
        check_decoders(frame)


@FUZZ
@given(batch(mutated(valid_frames)))
def test_codec_mutated_and_truncated_valid_frames(frames: list[bytes]) -> None:
    for frame in frames:
        count("codec: mutated/truncated valid frames")
        check_decoders(frame)


@FUZZ
@given(batch(st.tuples(valid_frames, st.floats(0, 1, exclude_max=True))))
def test_codec_every_prefix_of_a_valid_frame_is_refused(cases: list[tuple[bytes, float]]) -> None:
    for frame, where in cases:
        count("codec: truncated valid frames")
        cut = int(where * len(frame))
        try:
            decode(frame[:cut])
        except FrameRejected as err:
            assert err.reason == "malformed"
        else:
            raise AssertionError(f"a frame cut at {cut} of {len(frame)} bytes was accepted")


@FUZZ
@given(
    batch(
        st.tuples(
            versions,
            plausible_bodies | msgpack_values,
            st.dictionaries(st.text(max_size=8), msgpack_values, max_size=2),
        )
    )
)
def test_codec_structured_frames_of_any_version(cases: list[tuple]) -> None:
    for version, body, extra in cases:
        count("codec: structured frames, any version")
        check_decoders(msgspec.msgpack.encode({**extra, "version": version, "msg": body}))


@FUZZ
@given(st.integers(MAX_FRAME_BYTES - 2, MAX_FRAME_BYTES + 64), st.sampled_from([b"\x00", b"\xc1", b"\x91"]))
def test_codec_frames_around_the_size_limit(size: int, fill: bytes) -> None:
    count("codec: frames around MAX_FRAME_BYTES")
    frame = fill * size
    check_decoders(frame)
    if size > MAX_FRAME_BYTES:
        try:
            decode(frame)
        except OversizedFrame:
            pass
        else:
            raise AssertionError("an oversized frame was read")


SECRET = b"fuzz-secret"


@FUZZ
@given(
    batch(
        st.tuples(
            st.lists(st.binary(max_size=80), max_size=4) | valid_frames.map(lambda f: [f, b"\x00" * 56]),
            st.sampled_from([REQUEST, ACK]),
            st.booleans(),
        )
    )
)
def test_auth_unseal_of_arbitrary_parts(cases: list[tuple[list[bytes], bytes, bool]]) -> None:
    for parts, label, with_secret in cases:
        count("auth: unseal arbitrary parts")
        auth = FrameAuth(SECRET) if with_secret else None
        try:
            payload = unseal(auth, label, parts)
        except AuthFailure as err:
            assert err.reason == "auth" and str(err)
        except FrameRejected as err:
            assert err.reason == "malformed" and str(err)
        else:
            assert auth is None and payload == parts[0] and len(parts) == 1, "only one plain part passes"


@FUZZ
@given(
    batch(st.tuples(valid_frames, st.integers(0, 1), st.floats(0, 1, exclude_max=True), st.integers(1, 255)))
)
def test_auth_a_sealed_frame_with_any_byte_changed_is_refused(cases: list[tuple]) -> None:
    auth = FrameAuth(SECRET)
    for frame, which, where, xor in cases:
        count("auth: tampered sealed frames")
        parts = [frame, FrameAuth(SECRET).seal(REQUEST, frame)]
        flipped = bytearray(parts[which])
        flipped[int(where * len(flipped))] ^= xor
        parts[which] = bytes(flipped)
        try:
            unseal(auth, REQUEST, parts)
        except AuthFailure:
            pass
        else:
            raise AssertionError("a tampered frame was accepted")


# -- the NIXL metadata envelope an ack carries -----------------------------------------------------

envelopes = st.builds(
    wire.PeerInfo, st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.binary(max_size=64)
).map(wire.encode)


@FUZZ
@given(batch(st.binary(max_size=96) | mutated(envelopes) | envelopes))
def test_envelope_decodes_or_is_a_value_error_naming_the_peer(blobs: list[bytes]) -> None:
    for blob in blobs:
        count("nixl envelope: arbitrary/mutated")
        try:
            info = wire.decode(blob, peer="prod-fuzz")
        except ValueError as err:
            assert "'prod-fuzz'" in str(err)
            continue
        assert info.base_address > 0 and info.area_bytes > 0 and info.nixl_metadata
        assert wire.decode(wire.encode(info), peer="p") == info


# -- ec_transfer_params a request carries -----------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)
items = st.fixed_dictionaries(
    {},
    optional={
        "metadata": json_values | st.dictionaries(st.text(max_size=8), json_values, max_size=2),
        "peer_host": json_values | st.just("10.0.0.1"),
        "peer_port": json_values | st.integers(-1, 70000),
        "size_bytes": json_values | st.integers(-1, 2**40),
    },
)
params = st.dictionaries(
    st.text(max_size=20) | st.integers() | st.just("k" * 600), items | json_values, max_size=3
)


@FUZZ
@given(batch(params | json_values))
def test_transfer_params_parse_or_raise_protocol_error(raws: list) -> None:
    for raw in raws:
        count("ec_transfer_params: arbitrary")
        check_params(raw)


def check_params(raw: object) -> None:
    try:
        parsed = parse_transfer_params(raw)
    except ProtocolError as err:
        assert "ec_transfer_params" in str(err)
        return
    for mm_hash, ref in parsed.items():
        assert isinstance(mm_hash, str) and 0 < len(mm_hash) <= MAX_KEY_CHARS
        assert ref is None or (
            isinstance(ref, PeerRef) and ref.size_bytes > 0 and 0 < ref.address.port < 65536
        )
