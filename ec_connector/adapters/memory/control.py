"""A control plane inside one process: servers are callables registered by address.

Requests are answered synchronously at `send`; replies wait in the client until `poll`. Tests can
silence an address (requests vanish: the consumer sees an ack timeout) or drop it (the consumer is
told the peer is gone).
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

    def send(self, address: PeerAddress, message: XferReq | XferDone) -> None:
        self._network.sent.append((address, message))
        if address in self._network.silenced:
            return
        handlers = self._network.servers.get(address)
        if handlers is None:
            self._replies.append(Reply(address, None))
            return
        on_request, on_done = handlers
        if isinstance(message, XferReq):
            try:
                ack = on_request(message)
            except Exception as err:
                self._network.errors.append(err)
                ack = XferAck(PROTOCOL_VERSION, message.mm_hash, AckStatus.NACK_INTERNAL)
            self._replies.append(Reply(address, ack))
        else:
            try:
                on_done(message)
            except Exception as err:
                self._network.errors.append(err)

    def poll(self) -> list[Reply]:
        out, self._replies = self._replies, []
        return out

    def close(self) -> None:
        self._replies = []
