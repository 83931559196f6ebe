"""The control-plane ports' contract, one set of test bodies run against every adapter.

`world` gives the adapter under test: servers at addresses, clients, and an address nobody serves.
The fake answers at `send` (an ask answered NACK_NOT_READY at the poll after) and reports a
missing peer at once; the ZMQ adapter does it over real
sockets on 127.0.0.1 with heartbeats shortened to tenths of a second, so every body waits with a
bounded poll loop that both satisfy.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from ec_connector.adapters.memory import MemoryControlClient, MemoryControlServer, MemoryNetwork
from ec_connector.domain.protocol import (
    PROTOCOL_VERSION,
    AckStatus,
    XferAck,
    XferDone,
    XferReq,
    answer_status,
)
from ec_connector.domain.publish import PeerAddress
from ec_connector.ports.control import ControlClient, ControlServer, Reply

FP = "fp-0123"
WAIT_S = 3.0
HOLD_S = 0.5  # the ZMQ server's hold of a NACK_NOT_READY ask: far longer than a loaded machine's lag
OnRequest = Callable[[XferReq], XferAck]
OnDone = Callable[[XferDone], None]


class World:
    """Servers and clients of one adapter; everything made here is closed at teardown."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.network = MemoryNetwork()
        self.servers: dict[PeerAddress, ControlServer] = {}
        self.clients: list[ControlClient] = []

    def serve(self, on_request: OnRequest, on_done: OnDone = lambda done: None) -> PeerAddress:
        server: ControlServer
        if self.kind == "memory":
            address = PeerAddress(f"producer-{len(self.servers)}", 5601)
            server = MemoryControlServer(self.network, address)
        else:
            from ec_connector.adapters.zmq_control import ZmqControlServer

            server = ZmqControlServer("127.0.0.1", 0, not_ready_hold_s=HOLD_S)
            address = server.address
        server.start(on_request, on_done)
        self.servers[address] = server
        return address

    def client(self) -> ControlClient:
        client: ControlClient
        if self.kind == "memory":
            client = MemoryControlClient(self.network)
        else:
            from ec_connector.adapters.zmq_control import Heartbeat, ZmqControlClient

            client = ZmqControlClient(heartbeat=Heartbeat(0.1, 0.3, 0.5), connect_timeout_s=0.5)
        self.clients.append(client)
        return client

    def drop(self, address: PeerAddress) -> None:
        """The server at `address` goes away while clients are connected (a crash, a partition)."""
        if self.kind == "memory":
            self.network.disconnect(address)
        self.servers.pop(address).close()

    def nowhere(self) -> PeerAddress:
        if self.kind == "memory":
            return PeerAddress("nobody", 5601)
        with socket.socket() as probe:  # a port the kernel just handed out and nobody listens on
            probe.bind(("127.0.0.1", 0))
            return PeerAddress("127.0.0.1", probe.getsockname()[1])

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for server in self.servers.values():
            server.close()


@pytest.fixture(params=["memory", "zmq"])
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    made = World(request.param)
    yield made
    made.close()


def collect(
    client: ControlClient, until: Callable[[list[Reply]], bool], wait_s: float = WAIT_S
) -> list[Reply]:
    """Poll until `until(replies so far)` holds or `wait_s` passes; the replies gathered."""
    got: list[Reply] = []
    deadline = time.monotonic() + wait_s
    while True:
        got += client.poll()
        if until(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.002)


def settle(client: ControlClient, quiet_s: float = 0.05) -> list[Reply]:
    """Whatever else arrives within `quiet_s` (expected: nothing)."""
    return collect(client, lambda got: False, quiet_s)


def request(key: str, version: int = PROTOCOL_VERSION) -> XferReq:
    return XferReq(version, key, FP, "consumer-1", request_id=f"req-{key}")


def granting(agent: str = "producer") -> tuple[OnRequest, list[XferReq]]:
    seen: list[XferReq] = []
    lock = threading.Lock()

    def on_request(req: XferReq) -> XferAck:
        with lock:
            seen.append(req)
        return ok_ack(req.mm_hash, agent)

    return on_request, seen


def ok_ack(key: str, agent: str = "producer") -> XferAck:
    return XferAck(
        version=PROTOCOL_VERSION,
        mm_hash=key,
        status=AckStatus.OK,
        size_bytes=3 * 7168,
        rows=3,
        runs=((0, 7168), (71680, 14336)),
        grant_id=41,
        agent_name=agent,
        agent_metadata=bytes(range(256)) * 16,
    )


def test_a_request_is_answered_with_the_ack_its_handler_made(world: World) -> None:
    on_request, seen = granting()
    address = world.serve(on_request)
    client = world.client()
    client.send(address, request("img-a"))
    replies = collect(client, lambda got: len(got) >= 1)
    assert replies == [Reply(address, ok_ack("img-a"))]
    assert seen == [request("img-a")]


def test_a_done_reaches_on_done(world: World) -> None:
    done: list[XferDone] = []
    address = world.serve(granting()[0], done.append)
    client = world.client()
    client.send(address, XferDone(PROTOCOL_VERSION, "img-a", 41))
    deadline = time.monotonic() + WAIT_S
    while not done and time.monotonic() < deadline:
        client.poll()
        time.sleep(0.002)
    assert done == [XferDone(PROTOCOL_VERSION, "img-a", 41)]
    assert settle(client) == [], "a done is not answered"


def test_wait_returns_once_a_reply_is_ready_and_false_when_none_comes(world: World) -> None:
    client = world.client()
    assert client.wait(0.05) is False  # nothing connected: at once
    address = world.serve(granting()[0])
    client.send(address, request("img-a"))
    assert client.wait(WAIT_S) is True
    replies = collect(client, lambda got: len(got) >= 1)
    assert [r.ack.mm_hash for r in replies if r.ack is not None] == ["img-a"]
    started = time.monotonic()
    assert client.wait(0.05) is False  # connected, nothing more to come
    assert time.monotonic() - started < 1.0
    client.send(address, XferDone(PROTOCOL_VERSION, "img-a", 41))  # a done is not answered
    assert client.wait(0.05) is False


def test_a_loss_wakes_a_wait(world: World) -> None:
    client = world.client()
    client.send(world.nowhere(), request("img-a"))
    assert client.wait(WAIT_S) is True
    replies = collect(client, lambda got: len(got) >= 1)
    assert replies and replies[0].ack is None


def test_each_reply_is_returned_once(world: World) -> None:
    address = world.serve(granting()[0])
    client = world.client()
    keys = [f"img-{i}" for i in range(5)]
    for key in keys:
        client.send(address, request(key))
    replies = collect(client, lambda got: len(got) >= len(keys))
    assert sorted(r.ack.mm_hash for r in replies if r.ack is not None) == keys
    assert all(r.address == address for r in replies)
    assert settle(client) == []


def test_one_client_addresses_several_producers(world: World) -> None:
    addresses = {world.serve(granting(agent=f"producer-{i}")[0]): f"producer-{i}" for i in range(3)}
    client = world.client()
    for address in addresses:
        client.send(address, request("shared-key"))
    replies = collect(client, lambda got: len(got) >= len(addresses))
    assert {r.address: r.ack.agent_name for r in replies if r.ack is not None} == addresses
    assert len(replies) == len(addresses)


def test_a_request_the_handler_raises_on_is_answered_nack_internal(world: World) -> None:
    def broken(req: XferReq) -> XferAck:
        raise RuntimeError("table exploded")

    address = world.serve(broken)
    client = world.client()
    client.send(address, request("img-a"))
    client.send(address, request("img-b"))
    replies = collect(client, lambda got: len(got) >= 2)
    assert replies == [
        Reply(address, XferAck(PROTOCOL_VERSION, "img-a", AckStatus.NACK_INTERNAL)),
        Reply(address, XferAck(PROTOCOL_VERSION, "img-b", AckStatus.NACK_INTERNAL)),
    ], "the server keeps answering after a callback fails"


def test_a_request_of_another_protocol_version_is_answered_nack_version(world: World) -> None:
    def producer_rule(req: XferReq) -> XferAck:
        return XferAck(PROTOCOL_VERSION, req.mm_hash, answer_status(req, fingerprint=FP, entry=None))

    address = world.serve(producer_rule)
    client = world.client()
    client.send(address, request("img-a", version=PROTOCOL_VERSION + 1))
    client.send(address, request("img-b"))
    replies = collect(client, lambda got: len(got) >= 2)
    assert [(r.ack.mm_hash, r.ack.status) for r in replies if r.ack is not None] == [
        ("img-a", AckStatus.NACK_VERSION),
        ("img-b", AckStatus.NACK_MISSING),
    ]


def test_a_request_to_an_address_nobody_serves_reports_the_peer_lost(world: World) -> None:
    address = world.nowhere()
    client = world.client()
    started = time.monotonic()
    client.send(address, request("img-a"))
    replies = collect(client, lambda got: len(got) >= 1)
    assert replies == [Reply(address, None)]
    assert time.monotonic() - started < 1.0
    assert settle(client) == [], "a loss is reported once"


def test_a_closed_server_is_reported_lost_and_answers_nothing_more(world: World) -> None:
    address = world.serve(granting()[0])
    client = world.client()
    client.send(address, request("img-a"))
    assert collect(client, lambda got: len(got) >= 1) == [Reply(address, ok_ack("img-a"))]
    world.servers[address].close()
    client.send(address, request("img-b"))
    replies = collect(client, lambda got: any(r.ack is None for r in got))
    assert replies and all(r == Reply(address, None) for r in replies)


def test_a_server_that_goes_away_is_reported_lost_without_another_send(world: World) -> None:
    # what lets a consumer give up a READ from a producer whose control connection died
    address = world.serve(granting()[0])
    other = world.serve(granting("other")[0])
    client = world.client()
    client.send(address, request("img-a"))
    client.send(other, request("img-b"))
    assert len(collect(client, lambda got: len(got) >= 2)) == 2
    world.drop(address)
    replies = collect(client, lambda got: any(r.ack is None for r in got))
    assert replies == [Reply(address, None)]
    assert settle(client) == []  # once, and nothing about the server still there


def test_the_next_send_after_a_loss_reaches_a_server_there_again(world: World) -> None:
    address = world.nowhere()
    client = world.client()
    client.send(address, request("img-a"))
    assert collect(client, lambda got: len(got) >= 1) == [Reply(address, None)]
    on_request, _ = granting()
    if world.kind == "memory":
        server: ControlServer = MemoryControlServer(world.network, address)
    else:
        from ec_connector.adapters.zmq_control import ZmqControlServer

        server = ZmqControlServer(address.host, address.port)
    world.servers[address] = server
    server.start(on_request, lambda done: None)
    client.send(address, request("img-b"))
    assert collect(client, lambda got: len(got) >= 1) == [Reply(address, ok_ack("img-b"))]


def test_close_is_idempotent(world: World) -> None:
    address = world.serve(granting()[0])
    client = world.client()
    client.send(address, request("img-a"))
    collect(client, lambda got: len(got) >= 1)
    for _ in range(2):
        client.close()
        world.servers[address].close()


def saving(landed: threading.Event) -> tuple[OnRequest, list[XferReq]]:
    """A handler whose entry is still saving (NACK_NOT_READY) until `landed` is set, then OK."""
    seen: list[XferReq] = []

    def on_request(req: XferReq) -> XferAck:
        seen.append(req)
        if landed.is_set():
            return ok_ack(req.mm_hash)
        return XferAck(PROTOCOL_VERSION, req.mm_hash, AckStatus.NACK_NOT_READY)

    return on_request, seen


def test_an_ask_whose_save_lands_during_its_hold_is_answered_ok(world: World) -> None:
    landed = threading.Event()
    on_request, seen = saving(landed)
    address = world.serve(on_request)
    client = world.client()
    client.send(address, request("img-a"))
    deadline = time.monotonic() + WAIT_S
    while not seen and time.monotonic() < deadline:  # the server has answered it NACK_NOT_READY once
        time.sleep(0.001)
    landed.set()  # held, it is asked again: OK now
    assert collect(client, lambda got: len(got) >= 1) == [Reply(address, ok_ack("img-a"))]
    assert len(seen) >= 2 and settle(client) == []


def test_an_ask_still_saving_when_its_hold_ends_is_answered_not_ready(world: World) -> None:
    on_request, seen = saving(threading.Event())
    address = world.serve(on_request)
    client = world.client()
    client.send(address, request("img-a"))
    replies = collect(client, lambda got: len(got) >= 1)
    assert replies == [Reply(address, XferAck(PROTOCOL_VERSION, "img-a", AckStatus.NACK_NOT_READY))]
    assert len(seen) >= 2 and settle(client) == []
