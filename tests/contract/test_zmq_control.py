"""The ZMQ control adapter beyond the shared contract: hostile frames, authentication, heartbeats,
peer processes killed, stopped and restarted. Real sockets on 127.0.0.1, raw ZMQ peers where a
test needs to speak outside the protocol.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
import zmq

from ec_connector.adapters.zmq_control import (
    MAX_FRAME_BYTES,
    ControlBindError,
    FrameAuth,
    Heartbeat,
    ZmqControlClient,
    ZmqControlServer,
)
from ec_connector.adapters.zmq_control.auth import ACK, REQUEST
from ec_connector.adapters.zmq_control.codec import decode_ack, encode
from ec_connector.domain.protocol import (
    MAX_RUNS_PER_ACK,
    PROTOCOL_VERSION,
    AckStatus,
    XferAck,
    XferDone,
    XferReq,
)
from ec_connector.domain.publish import PeerAddress
from ec_connector.ports.control import Reply

ROOT = Path(__file__).resolve().parents[2]
FAST = Heartbeat(ivl_s=0.1, timeout_s=0.3, ttl_s=0.5)
LOSS_BOUND_S = FAST.ivl_s + FAST.timeout_s + 0.5  # heartbeat detection plus scheduling slack
REQ = XferReq(PROTOCOL_VERSION, "img-a", "fp", "consumer-1")


def answer(req: XferReq) -> XferAck:
    return XferAck(PROTOCOL_VERSION, req.mm_hash, AckStatus.OK, agent_name="producer", grant_id=7)


def wait_until(predicate: Callable[[], bool], wait_s: float = 3.0) -> bool:
    deadline = time.monotonic() + wait_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def collect(client: ZmqControlClient, count: int, wait_s: float = 3.0) -> list[Reply]:
    got: list[Reply] = []
    wait_until(lambda: bool(got.extend(client.poll())) or len(got) >= count, wait_s)
    return got


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def server() -> Iterator[ZmqControlServer]:
    made = ZmqControlServer("127.0.0.1", 0)
    made.start(answer, lambda done: None)
    yield made
    made.close()


@pytest.fixture
def client() -> Iterator[ZmqControlClient]:
    made = ZmqControlClient(heartbeat=FAST, connect_timeout_s=0.5)
    yield made
    made.close()


def raw_dealer(ctx: zmq.Context, address: PeerAddress) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.rcvtimeo = 3000
    sock.connect(f"tcp://{address.host}:{address.port}")
    return sock


def frame(body: dict, version: int = PROTOCOL_VERSION) -> bytes:
    return msgspec.msgpack.encode({"version": version, "msg": body})


GOOD = encode(REQ)
BAD_FRAMES = {
    "garbage": ([b"\xc1\xc1 not msgpack"], "malformed"),
    "empty": ([b""], "malformed"),
    "truncated": ([GOOD[:-4]], "malformed"),
    "trailing bytes": ([GOOD + b"\x00"], "malformed"),
    "not a map": ([msgspec.msgpack.encode([1, 2, 3])], "malformed"),
    "wrong field type": (
        [frame({"type": "req", "mm_hash": 5, "fingerprint": "f", "consumer": "c"})],
        "malformed",
    ),
    "version as string": ([msgspec.msgpack.encode({"version": "1", "msg": {}})], "malformed"),
    "unknown message type": ([frame({"type": "evil", "mm_hash": "k"})], "malformed"),
    "key too long": (
        [frame({"type": "req", "mm_hash": "k" * 513, "fingerprint": "f", "consumer": "c"})],
        "malformed",
    ),
    "negative grant": ([frame({"type": "done", "mm_hash": "k", "grant_id": -1})], "malformed"),
    "nesting bomb": ([b"\x82\xa7version\x01\xa3msg" + b"\x91" * 100_000 + b"\x00"], "malformed"),
    "three parts": ([GOOD, b"x", b"y"], "malformed"),
    "two parts without a secret": ([GOOD, b"\x00" * 56], "auth"),
    "oversized": ([b"\x00" * (MAX_FRAME_BYTES + 1)], "oversized"),
    "an ack": ([encode(answer(REQ))], "unexpected"),
    "a done of another version": (
        [frame({"type": "done", "mm_hash": "k", "grant_id": 1}, version=99)],
        "version",
    ),
}


@pytest.mark.parametrize("name", list(BAD_FRAMES))
def test_a_bad_frame_is_dropped_counted_and_the_server_answers_the_next(
    name: str, server: ZmqControlServer, ctx: zmq.Context
) -> None:
    parts, reason = BAD_FRAMES[name]
    sock = raw_dealer(ctx, server.address)
    sock.send_multipart(parts)
    assert wait_until(lambda: server.dropped[reason] == 1), server.dropped
    assert sum(server.dropped.values()) == 1
    sock.send(GOOD)
    assert decode_ack(sock.recv()) == answer(REQ)
    assert wait_until(lambda: server.answered == 1)


def test_a_part_past_the_hard_cap_cuts_only_that_connection(
    server: ZmqControlServer, client: ZmqControlClient, ctx: zmq.Context
) -> None:
    sock = raw_dealer(ctx, server.address)
    sock.send(b"\x00" * (3 * MAX_FRAME_BYTES))
    client.send(server.address, REQ)
    assert collect(client, 1) == [Reply(server.address, answer(REQ))]
    sock.send(GOOD)  # ZMQ reconnects the cut raw peer; the server serves it again
    assert decode_ack(sock.recv()) == answer(REQ)


@pytest.mark.parametrize(
    "body, key",
    [
        (
            {"type": "req", "mm_hash": "img-a", "fingerprint": ["a", "new", "shape"], "extra": {"x": 1}},
            "img-a",
        ),
        ({"type": "req", "mm_hash": 12}, ""),
        ("a body this version cannot read", ""),
    ],
)
def test_a_request_of_another_version_is_answered_nack_version_as_far_as_it_reads(
    body: object, key: str, server: ZmqControlServer, ctx: zmq.Context
) -> None:
    sock = raw_dealer(ctx, server.address)
    sock.send(msgspec.msgpack.encode({"version": PROTOCOL_VERSION + 1, "msg": body, "future": True}))
    assert decode_ack(sock.recv()) == XferAck(PROTOCOL_VERSION, key, AckStatus.NACK_VERSION)
    assert sum(server.dropped.values()) == 0


def test_an_ack_the_codec_refuses_is_answered_nack_internal(client: ZmqControlClient) -> None:
    def too_many_runs(req: XferReq) -> XferAck:
        runs = tuple((i * 2, 1) for i in range(MAX_RUNS_PER_ACK + 1))
        return XferAck(PROTOCOL_VERSION, req.mm_hash, AckStatus.OK, runs=runs)

    server = ZmqControlServer("127.0.0.1", 0)
    try:
        server.start(too_many_runs, lambda done: None)
        client.send(server.address, REQ)
        assert collect(client, 1) == [
            Reply(server.address, XferAck(PROTOCOL_VERSION, "img-a", AckStatus.NACK_INTERNAL))
        ]
        assert server.callback_errors == 1
    finally:
        server.close()


def test_a_raising_on_done_is_counted_and_serving_goes_on(client: ZmqControlClient) -> None:
    def broken(done: XferDone) -> None:
        raise KeyError(done.grant_id)

    server = ZmqControlServer("127.0.0.1", 0)
    try:
        server.start(answer, broken)
        client.send(server.address, XferDone(PROTOCOL_VERSION, "img-a", 3))
        client.send(server.address, REQ)
        assert collect(client, 1) == [Reply(server.address, answer(REQ))]
        assert server.callback_errors == 1
    finally:
        server.close()


# -- authentication ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "server_secret, client_secret",
    [("s3cret", "another"), ("s3cret", None), (None, "s3cret")],
    ids=["different secrets", "client without", "server without"],
)
def test_mismatched_secrets_are_refused_and_counted(
    server_secret: str | None, client_secret: str | None
) -> None:
    called: list[XferReq] = []
    server = ZmqControlServer("127.0.0.1", 0, secret=server_secret)
    client = ZmqControlClient(heartbeat=FAST, secret=client_secret)
    try:
        server.start(lambda req: called.append(req) or answer(req), lambda done: None)
        client.send(server.address, REQ)
        assert wait_until(lambda: server.dropped["auth"] == 1)
        assert collect(client, 1, wait_s=0.2) == []
        assert called == []
    finally:
        client.close()
        server.close()


def test_the_same_secret_on_both_ends_is_served_both_ways() -> None:
    done: list[XferDone] = []
    server = ZmqControlServer("127.0.0.1", 0, secret=b"\x00shared\xff")
    client = ZmqControlClient(heartbeat=FAST, secret=b"\x00shared\xff")
    try:
        server.start(answer, done.append)
        client.send(server.address, REQ)
        client.send(server.address, XferDone(PROTOCOL_VERSION, "img-a", 7))
        assert collect(client, 1) == [Reply(server.address, answer(REQ))]
        assert wait_until(lambda: len(done) == 1)
        assert sum(server.dropped.values()) == sum(client.dropped.values()) == 0
    finally:
        client.close()
        server.close()


def test_a_replayed_or_stale_authenticated_frame_is_refused(ctx: zmq.Context) -> None:
    server = ZmqControlServer("127.0.0.1", 0, secret="s3cret")
    try:
        server.start(answer, lambda done: None)
        sock = raw_dealer(ctx, server.address)
        sealed = [GOOD, FrameAuth("s3cret").seal(REQUEST, GOOD)]
        sock.send_multipart(sealed)
        payload, trailer = sock.recv_multipart()
        FrameAuth("s3cret").check(ACK, payload, trailer)
        assert decode_ack(payload) == answer(REQ)
        sock.send_multipart(sealed)
        assert wait_until(lambda: server.dropped["auth"] == 1), "replay"
        stale = FrameAuth("s3cret", clock=lambda: time.time() - 60)
        sock.send_multipart([GOOD, stale.seal(REQUEST, GOOD)])
        assert wait_until(lambda: server.dropped["auth"] == 2), "stale"
        sock.send_multipart([GOOD, FrameAuth("s3cret").seal(ACK, GOOD)])
        assert wait_until(lambda: server.dropped["auth"] == 3), "sealed for the other direction"
        assert wait_until(lambda: server.answered == 1)
    finally:
        server.close()


# -- the client facing a hostile or odd producer ------------------------------------------------


def test_the_client_drops_bad_acks_and_reads_other_versions_as_nack_version(
    client: ZmqControlClient, ctx: zmq.Context
) -> None:
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.rcvtimeo = 3000
    port = router.bind_to_random_port("tcp://127.0.0.1")
    address = PeerAddress("127.0.0.1", port)
    client.send(address, REQ)
    peer, _ = router.recv_multipart()
    router.send_multipart([peer, b"\xc1 garbage"])
    router.send_multipart([peer, encode(REQ)])
    router.send_multipart([peer, encode(answer(REQ)), b"\x00" * 56])
    router.send_multipart([peer, frame({"type": "ack", "mm_hash": "img-a", "status": "NACK_NEW"})])
    router.send_multipart([peer, frame({"type": "ack", "mm_hash": "img-a", "status": "NEW"}, version=9)])
    router.send_multipart([peer, encode(answer(REQ))])
    replies = collect(client, 2)
    assert replies == [
        Reply(address, XferAck(9, "img-a", AckStatus.NACK_VERSION)),
        Reply(address, answer(REQ)),
    ]
    assert client.dropped == {**client.dropped, "malformed": 2, "unexpected": 1, "auth": 1}


def test_a_peer_that_never_completes_the_handshake_is_lost_within_the_connect_timeout(
    client: ZmqControlClient,
) -> None:
    with socket.socket() as silent:  # accepts TCP (in the kernel's backlog) but never speaks ZMTP
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = PeerAddress("127.0.0.1", silent.getsockname()[1])
        started = time.monotonic()
        client.send(address, REQ)
        assert collect(client, 1) == [Reply(address, None)]
        assert 0.4 < time.monotonic() - started < 1.5


def test_a_full_send_queue_drops_the_message_and_reports_the_peer_lost() -> None:
    client = ZmqControlClient(heartbeat=FAST, connect_timeout_s=2.0, hwm=4)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = PeerAddress("127.0.0.1", silent.getsockname()[1])
        try:
            sent = 0
            while not client.poll() and sent < 100:
                client.send(address, REQ)
                sent += 1
            assert sent < 100
            assert client.poll() == [], "reported once"
        finally:
            client.close()


# -- lifecycle -----------------------------------------------------------------------------------


def test_a_taken_port_fails_with_the_address_and_the_settings_to_change(server: ZmqControlServer) -> None:
    with pytest.raises(ControlBindError) as failure:
        ZmqControlServer("127.0.0.1", server.address.port)
    message = str(failure.value)
    assert f"127.0.0.1:{server.address.port}" in message
    assert "VLLM_EC_SIDE_CHANNEL_HOST" in message and "VLLM_EC_SIDE_CHANNEL_PORT" in message


def test_close_is_prompt_and_frees_the_port_for_a_new_server() -> None:
    server = ZmqControlServer("127.0.0.1", 0)
    server.start(answer, lambda done: None)
    threads = threading.active_count()
    started = time.monotonic()
    server.close()
    assert time.monotonic() - started < 0.5
    assert threading.active_count() == threads - 1
    again = ZmqControlServer("127.0.0.1", server.address.port)
    again.close()
    again.close()


def test_a_server_closed_before_start_releases_its_port() -> None:
    server = ZmqControlServer("localhost", 0)
    server.close()
    ZmqControlServer("localhost", server.address.port).close()
    with pytest.raises(RuntimeError):
        server.start(answer, lambda done: None)


# -- peers in other processes --------------------------------------------------------------------

SERVER_SCRIPT = textwrap.dedent(
    """
    import signal, sys
    from ec_connector.adapters.zmq_control import ZmqControlServer
    from ec_connector.domain.protocol import PROTOCOL_VERSION, AckStatus, XferAck
    server = ZmqControlServer("127.0.0.1", int(sys.argv[1]))
    server.start(
        lambda req: XferAck(PROTOCOL_VERSION, req.mm_hash, AckStatus.OK, agent_name=sys.argv[2]),
        lambda done: None,
    )
    print("PORT", server.address.port, flush=True)
    signal.pause()
    """
)


class ServerProcess:
    def __init__(self, port: int, name: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER_SCRIPT, str(port), name],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # the server's own log lines come first
            if line.startswith("PORT "):
                self.address = PeerAddress("127.0.0.1", int(line.split()[1]))
                return
        raise AssertionError(f"the server process ended with {self.proc.wait(10)} before binding")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def spawn() -> Iterator[Callable[[int, str], ServerProcess]]:
    made: list[ServerProcess] = []

    def start(port: int, name: str) -> ServerProcess:
        made.append(ServerProcess(port, name))
        return made[-1]

    yield start
    for proc in made:
        proc.kill()


def test_a_killed_server_is_lost_at_once_and_its_restart_is_reached_again(
    client: ZmqControlClient, spawn: Callable[[int, str], ServerProcess]
) -> None:
    first = spawn(0, "first")
    client.send(first.address, REQ)
    assert [r.ack.agent_name for r in collect(client, 1) if r.ack] == ["first"]
    first.kill()
    started = time.monotonic()
    assert collect(client, 1) == [Reply(first.address, None)]
    assert time.monotonic() - started < LOSS_BOUND_S, "the OS closed its socket: no heartbeat needed"
    second = spawn(first.address.port, "second")
    client.send(second.address, REQ)
    assert [r.ack.agent_name for r in collect(client, 1) if r.ack] == ["second"]


def test_a_stopped_server_is_lost_when_its_heartbeats_go_unanswered(
    client: ZmqControlClient, spawn: Callable[[int, str], ServerProcess]
) -> None:
    frozen = spawn(0, "frozen")
    client.send(frozen.address, REQ)
    assert len(collect(client, 1)) == 1
    os.kill(frozen.proc.pid, signal.SIGSTOP)  # the socket stays open; only heartbeats can tell
    started = time.monotonic()
    assert collect(client, 1) == [Reply(frozen.address, None)]
    assert time.monotonic() - started < LOSS_BOUND_S


def test_a_held_ask_is_asked_again_at_doubling_gaps_not_every_wake_up(client: ZmqControlClient) -> None:
    """Held 0.2 s and never saved: asked again after 1, 2, then every 4 ms (about 50 asks), not at
    each 1 ms wake-up (about 200), then answered NACK_NOT_READY."""
    asks: list[float] = []

    def never_saved(req: XferReq) -> XferAck:
        asks.append(time.monotonic())
        return XferAck(PROTOCOL_VERSION, req.mm_hash, AckStatus.NACK_NOT_READY)

    made = ZmqControlServer("127.0.0.1", 0, not_ready_hold_s=0.2)
    made.start(never_saved, lambda done: None)
    try:
        client.send(made.address, REQ)
        replies = collect(client, 1)
        assert [r.ack.status for r in replies if r.ack] == [AckStatus.NACK_NOT_READY]
        assert asks[-1] - asks[0] >= 0.19, "held for its whole hold"
        assert 10 <= len(asks) <= 60, len(asks)
        gaps = sorted(b - a for a, b in zip(asks[2:], asks[3:], strict=False))
        # the gaps are kept on the I/O thread's clock; a late wake-up shortens the next one as seen here
        assert gaps[len(gaps) // 2] >= 0.0035, "at its cap, asks come about 4 ms apart"
    finally:
        made.close()
