"""The P2P control plane: requests for reads and their acks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ec_connector.domain.protocol import XferAck, XferDone, XferReq
from ec_connector.domain.publish import PeerAddress


@dataclass(frozen=True, slots=True)
class Reply:
    """An ack from `address`, or (ack None) word that the peer at `address` is gone."""

    address: PeerAddress
    ack: XferAck | None


class ControlServer(Protocol):
    def start(
        self,
        on_request: Callable[[XferReq], XferAck],
        on_done: Callable[[XferDone], None],
    ) -> None:
        """Begin answering peers from a background thread; the callbacks must be thread-safe."""
        ...

    def close(self) -> None:
        """Stop answering and release the socket; idempotent; blocks until the thread ends."""
        ...


class ControlClient(Protocol):
    def send(self, address: PeerAddress, message: XferReq | XferDone) -> None:
        """Queue `message` for the producer at `address`; non-blocking."""
        ...

    def poll(self) -> list[Reply]:
        """Replies and peer losses since the last poll; non-blocking; each returned once."""
        ...

    def close(self) -> None:
        """Drop every connection; idempotent."""
        ...
