"""A control plane inside one process: servers are callables registered by address.

Requests are answered synchronously at `send`; replies wait in the client until `poll`. An ask
answered NACK_NOT_READY is held, as the ZMQ server holds it, and asked again at the client's next
`poll`, whose reply is whatever that answer is (the hold's end, in a world without time). Tests can
silence an address (requests vanish: the consumer sees an ack timeout), close its server (the next
request is told the peer is gone) or `disconnect` it (every client that talked to it is told at once,
as heartbeats going unanswered tell the ZMQ client).
"""

from __future__ import annotations

from collections.abc import Callable

from ec_connector.domain.protocol import PROTOCOL_VERSION, AckStatus, XferAck, XferDone, XferReq
from ec_connector.domain.publish import PeerAddress
from ec_connector.ports.control import Reply

Handlers = tuple[Callable[[XferReq], XferAck], Callable[[XferDone], None]]


class MemoryNetwork:
    def __init__(self) -> None:
        self.servers: dict[PeerAddress, Handlers] = {}
        self.silenced: set[PeerAddress] = set()
        self.sent: list[tuple[PeerAddress, XferReq | XferDone]] = []
        self.errors: list[Exception] = []
        self.clients: list[MemoryControlClient] = []

    def disconnect(self, address: PeerAddress) -> None:
        """The server at `address` goes away; clients connected to it hear of it on their next poll."""
        self.servers.pop(address, None)
        for client in self.clients:
            client.lose(address)


class MemoryControlServer:
    def __init__(self, network: MemoryNetwork, address: PeerAddress) -> None:
        self._network = network
        self.address = address

    def start(
        self,
        on_request: Callable[[XferReq], XferAck],
        on_done: Callable[[XferDone], None],
    ) -> None:
        self._network.servers[self.address] = (on_request, on_done)

    def close(self) -> None:
        self._network.servers.pop(self.address, None)


class MemoryControlClient:
    def __init__(self, network: MemoryNetwork) -> None:
        self._network = network
        self._replies: list[Reply] = []
        self._held: list[tuple[PeerAddress, XferReq]] = []  # asks answered NACK_NOT_READY at send
        self._talked_to: set[PeerAddress] = set()
        network.clients.append(self)

    def lose(self, address: PeerAddress) -> None:
        if address in self._talked_to:
            self._talked_to.discard(address)
            self._replies.append(Reply(address, None))

    def send(self, address: PeerAddress, message: XferReq | XferDone) -> None:
        self._network.sent.append((address, message))
        if address in self._network.silenced:
            return
        handlers = self._network.servers.get(address)
        if handlers is None:
            self._replies.append(Reply(address, None))
            return
        self._talked_to.add(address)
        on_request, on_done = handlers
        if isinstance(message, XferReq):
            ack = self._answer(on_request, message)
            if ack.status is AckStatus.NACK_NOT_READY:
                self._held.append((address, message))
            else:
                self._replies.append(Reply(address, ack))
        else:
            try:
                on_done(message)
            except Exception as err:
                self._network.errors.append(err)

    def _answer(self, on_request: Callable[[XferReq], XferAck], req: XferReq) -> XferAck:
        try:
            return on_request(req)
        except Exception as err:
            self._network.errors.append(err)
            return XferAck(PROTOCOL_VERSION, req.mm_hash, AckStatus.NACK_INTERNAL)

    def poll(self) -> list[Reply]:
        held, self._held = self._held, []
        for address, req in held:  # the hold ends: asked once more, answered whatever it says
            handlers = self._network.servers.get(address)
            if handlers is not None and address not in self._network.silenced:
                self._replies.append(Reply(address, self._answer(handlers[0], req)))
        out, self._replies = self._replies, []
        return out

    def wait(self, timeout_s: float) -> bool:
        return bool(self._replies or self._held)  # replies are made at send or at the poll ending a hold

    def close(self) -> None:
        self._replies, self._held = [], []
        if self in self._network.clients:
            self._network.clients.remove(self)
