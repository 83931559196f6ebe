"""The wire codec of the control plane: msgspec MessagePack frames of the protocol values.

A frame is one MessagePack map, `{"version": int, "msg": {"type": "req" | "ack" | "done", ...}}`,
at most `MAX_FRAME_BYTES` long. `version` and `msg.mm_hash` are the two things every protocol
version keeps where they are, so a frame of another version is still read far enough to answer it
(`VersionMismatch` carries both). Field names are the domain dataclasses' fields (`XferReq`,
`XferAck`, `XferDone`); the domain `version` field travels as the envelope's `version`.

Decoding validates everything a peer controls: types (no coercion), key lengths (`MAX_KEY_CHARS`),
the ack status vocabulary, run counts (`MAX_RUNS_PER_ACK`), non-negative offsets and sizes, and
positive run lengths. Every rejection is a `FrameRejected` (a `ProtocolError`) whose `reason` is the
counter a receiver bumps. Encoding checks the same rules, so what one end sends the other accepts.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

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

MAX_FRAME_BYTES = 1 << 20
"""Largest encoded frame accepted (an OK ack carries a few KiB of NIXL agent metadata)."""

Message = XferReq | XferAck | XferDone


class FrameRejected(ProtocolError):
    """A frame was refused; `reason` names the drop counter. Drop the frame and count it."""

    reason = "malformed"


class OversizedFrame(FrameRejected):
    reason = "oversized"


class UnexpectedMessage(FrameRejected):
    """A well-formed message of a kind this end never receives (an ack sent to a server)."""

    reason = "unexpected"


class VersionMismatch(FrameRejected):
    """The frame speaks another protocol version; `kind` and `mm_hash` are read when possible.

    A receiver answers what may be a request (any kind but "ack" and "done") NACK_VERSION and
    reads what may be an ack (any kind but "req" and "done") as one; it drops the rest.
    """

    reason = "version"

    def __init__(self, version: int, kind: str, mm_hash: str) -> None:
        super().__init__(
            f"frame speaks protocol version {version}, this end speaks {PROTOCOL_VERSION} "
            f"(kind {kind or '?'}, mm_hash {mm_hash!r}): upgrade the older end"
        )
        self.version = version
        self.kind = kind
        self.mm_hash = mm_hash


_Key = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_KEY_CHARS)]
_Text = Annotated[str, msgspec.Meta(max_length=MAX_KEY_CHARS)]
_Count = Annotated[int, msgspec.Meta(ge=0)]
_Run = tuple[Annotated[int, msgspec.Meta(ge=0)], Annotated[int, msgspec.Meta(ge=1)]]
_Runs = Annotated[tuple[_Run, ...], msgspec.Meta(max_length=MAX_RUNS_PER_ACK)]


class _Req(msgspec.Struct, tag="req", frozen=True):
    mm_hash: _Key
    fingerprint: _Text
    consumer: _Text
    request_id: _Text = ""


class _Ack(msgspec.Struct, tag="ack", frozen=True):
    mm_hash: _Text
    status: AckStatus
    size_bytes: _Count = 0
    rows: _Count = 0
    runs: _Runs = ()
    grant_id: _Count = 0
    agent_name: _Text = ""
    agent_metadata: bytes = b""


class _Done(msgspec.Struct, tag="done", frozen=True):
    mm_hash: _Key
    grant_id: _Count


_Body = _Req | _Ack | _Done


class _Frame(msgspec.Struct, frozen=True):
    version: int
    msg: _Body


class _Probe(msgspec.Struct, frozen=True):
    """Just enough of any version's frame to answer it: the version, the body left unread."""

    version: int
    msg: msgspec.Raw


class _Keyed(msgspec.Struct, frozen=True):
    type: Any = None
    mm_hash: Any = None


_encoder = msgspec.msgpack.Encoder()
_frame = msgspec.msgpack.Decoder(_Frame)
_probe = msgspec.msgpack.Decoder(_Probe)
_body = msgspec.msgpack.Decoder(_Body)
_keyed = msgspec.msgpack.Decoder(_Keyed)


def encode(message: Message) -> bytes:
    """The frame for `message`; raises FrameRejected if a peer would refuse it (caller bug)."""
    if isinstance(message, XferReq):
        body: _Body = _Req(message.mm_hash, message.fingerprint, message.consumer, message.request_id)
    elif isinstance(message, XferAck):
        body = _Ack(
            mm_hash=message.mm_hash,
            status=_status(message.status),
            size_bytes=message.size_bytes,
            rows=message.rows,
            runs=tuple((int(off), int(length)) for off, length in message.runs),
            grant_id=message.grant_id,
            agent_name=message.agent_name,
            agent_metadata=bytes(message.agent_metadata),
        )
    elif isinstance(message, XferDone):
        body = _Done(message.mm_hash, message.grant_id)
    else:
        raise TypeError(f"cannot encode {type(message).__name__}: expected XferReq, XferAck or XferDone")
    frame = _encoder.encode(_Frame(message.version, body))
    check_size(len(frame))
    # msgspec validates on decode only: read the frame back so a bad value fails here, not at the peer.
    try:
        _frame.decode(frame)
    except msgspec.ValidationError as err:
        raise FrameRejected(f"refusing to send {type(message).__name__}: {err}") from err
    return frame


def decode(frame: bytes | memoryview) -> Message:
    """The message in `frame`; raises FrameRejected (VersionMismatch for another version)."""
    check_size(len(frame))
    try:
        probe = _probe.decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as err:
        raise FrameRejected(f"malformed frame ({len(frame)} bytes): {err}") from err
    if probe.version != PROTOCOL_VERSION:
        kind, mm_hash = _lenient_key(probe.msg)
        raise VersionMismatch(probe.version, kind, mm_hash)
    body = _decode_body(probe.msg)
    if isinstance(body, _Req):
        return XferReq(probe.version, body.mm_hash, body.fingerprint, body.consumer, body.request_id)
    if isinstance(body, _Ack):
        return XferAck(
            version=probe.version,
            mm_hash=body.mm_hash,
            status=body.status,
            size_bytes=body.size_bytes,
            rows=body.rows,
            runs=body.runs,
            grant_id=body.grant_id,
            agent_name=body.agent_name,
            agent_metadata=body.agent_metadata,
        )
    return XferDone(probe.version, body.mm_hash, body.grant_id)


def decode_request(frame: bytes | memoryview) -> XferReq | XferDone:
    """What a server accepts: a request or a done; an ack raises UnexpectedMessage."""
    message = decode(frame)
    if isinstance(message, XferAck):
        raise UnexpectedMessage(f"a server received an ack for {message.mm_hash!r}; peers send it requests")
    return message


def decode_ack(frame: bytes | memoryview) -> XferAck:
    """What a client accepts: an ack; any other kind raises UnexpectedMessage."""
    message = decode(frame)
    if not isinstance(message, XferAck):
        raise UnexpectedMessage(f"a client received a {type(message).__name__}; servers send it acks")
    return message


def _status(status: AckStatus | str) -> AckStatus:
    try:
        return AckStatus(status)
    except ValueError as err:
        raise FrameRejected(f"refusing to send ack status {status!r}: not an AckStatus") from err


def check_size(size: int) -> None:
    """Raise OversizedFrame if a frame of `size` bytes is over MAX_FRAME_BYTES."""
    if size > MAX_FRAME_BYTES:
        raise OversizedFrame(f"frame of {size} bytes exceeds MAX_FRAME_BYTES={MAX_FRAME_BYTES}")


def _decode_body(raw: bytes | msgspec.Raw) -> _Body:
    try:
        return _body.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as err:
        raise FrameRejected(f"malformed message: {err}") from err


def _lenient_key(raw: msgspec.Raw) -> tuple[str, str]:
    """The kind and key of another version's body, each "" where it cannot be read."""
    try:
        keyed = _keyed.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return "", ""
    kind = keyed.type if isinstance(keyed.type, str) and len(keyed.type) <= 16 else ""
    key = keyed.mm_hash if isinstance(keyed.mm_hash, str) and len(keyed.mm_hash) <= MAX_KEY_CHARS else ""
    return kind, key
