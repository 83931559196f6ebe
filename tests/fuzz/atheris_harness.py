"""Coverage-guided fuzzing (atheris / libFuzzer) of the decoders a peer or an operator feeds.

    .venv/bin/pip install atheris                  # optional; not in requirements
    .venv/bin/python tests/fuzz/atheris_harness.py -atheris_runs=100000

The first input byte picks the target: the control-frame codec (server and client views), the
frame authenticator, the NIXL metadata envelope, `ec_transfer_params` (as JSON) or
`ec_connector_extra_config` (as JSON). Any exception other than the documented one is a crash
and libFuzzer stops with the input saved as `crash-*` in the working directory. The run starts
from a seed corpus of valid inputs for every target (written to $EC_ATHERIS_CORPUS, default
/tmp/ec_atheris_corpus), since the msgspec decoder is C code that libFuzzer cannot see into.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

with atheris.instrument_imports():
    from ec_connector.adapters.nixl_data import wire
    from ec_connector.adapters.zmq_control.auth import REQUEST, FrameAuth, unseal
    from ec_connector.adapters.zmq_control.codec import (
        FrameRejected,
        decode,
        decode_ack,
        decode_request,
        encode,
    )
    from ec_connector.domain.config import parse_config
    from ec_connector.domain.errors import ConfigError, ProtocolError
    from ec_connector.domain.protocol import PROTOCOL_VERSION, AckStatus, XferAck, XferDone, XferReq
    from ec_connector.domain.publish import PeerAddress, parse_transfer_params, publish

AUTH = FrameAuth(b"atheris")
ROLES = ("ec_producer", "ec_consumer", "ec_both", "ec_other")


def _codec(data: bytes) -> None:
    for decoder in (decode, decode_request, decode_ack):
        try:
            message = decoder(data)
        except FrameRejected:
            continue
        if decode(encode(message)) != message:
            raise AssertionError(f"{message!r} does not survive its round trip")


def _auth(data: bytes) -> None:
    cut = data[0] if data else 0
    parts = [data[1 : 1 + cut], data[1 + cut :]] if cut % 2 else [data[1:]]
    try:
        unseal(AUTH, REQUEST, parts)
    except FrameRejected:
        return
    raise AssertionError("a frame passed authentication without the secret")


def _envelope(data: bytes) -> None:
    with contextlib.suppress(ValueError):
        wire.decode(data, peer="p")


def _json(data: bytes) -> object:
    try:
        return json.loads(data.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None


def _params(data: bytes) -> None:
    raw = _json(data)
    with contextlib.suppress(ProtocolError):
        parse_transfer_params(raw)


def _config(data: bytes) -> None:
    role = ROLES[data[0] % len(ROLES)] if data else ROLES[0]
    raw = _json(data[1:])
    with contextlib.suppress(ConfigError):
        parse_config(raw, role=role)


TARGETS = (_codec, _codec, _auth, _envelope, _params, _config)


def one_input(data: bytes) -> None:
    if not data:
        return
    TARGETS[data[0] % len(TARGETS)](data[1:])


def seeds() -> list[bytes]:
    """Valid inputs of every target, each prefixed with its target byte."""
    frames = [
        encode(XferReq(PROTOCOL_VERSION, "img-a", "f" * 64, "consumer-1", "req-1")),
        encode(XferDone(PROTOCOL_VERSION, "img-a", 7)),
        encode(
            XferAck(
                PROTOCOL_VERSION,
                "img-a",
                AckStatus.OK,
                4096,
                32,
                ((0, 2048), (8192, 2048)),
                3,
                "prod_dp0",
                b"m" * 64,
            )
        ),
    ]
    # sealed under another secret: a mutation that passes would be a forged MAC
    other = FrameAuth(b"not-the-harness-secret")
    sealed = [bytes([len(f) | 1]) + f + other.seal(REQUEST, f) for f in frames if len(f) < 255]
    params = json.dumps(
        publish({"img-a": {"image_grid_thw": [1, 4, 4]}}, {"img-a": 4096}, PeerAddress("h", 5601))
    )
    extra = json.dumps({"ec_cpu_bytes": 1 << 30, "ec_enable_nixl": "true", "read_timeout_s": 20.0})
    return (
        [b"\x00" + f for f in frames]
        + [b"\x02" + s for s in sealed]
        + [b"\x03" + wire.encode(wire.PeerInfo(0x7F0000001000, 1 << 20, b"nixl-md"))]
        + [b"\x04" + params.encode()]
        + [b"\x05\x00" + extra.encode()]
    )


def main() -> None:
    corpus = Path(os.environ.get("EC_ATHERIS_CORPUS", "/tmp/ec_atheris_corpus"))
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(seeds()):
        (corpus / f"seed-{i}").write_bytes(seed)
    argv = sys.argv if any(Path(a).is_dir() for a in sys.argv[1:]) else [*sys.argv, str(corpus)]
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
