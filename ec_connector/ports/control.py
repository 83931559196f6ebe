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
    address: PeerAddress
    """Where peers reach this server: the bound port when it was asked for port 0."""

    def start(
        self,
        on_request: Callable[[XferReq], XferAck],
        on_done: Callable[[XferDone], None],
    ) -> None:
        """Begin answering peers from a background thread; the callbacks must be thread-safe.

        A request `on_request` raises on is answered NACK_INTERNAL; an exception from either
        callback is logged (the fake records it) and never stops the server.
        """
        ...

    def close(self) -> None:
        """Stop answering and release the socket; idempotent; blocks until the thread ends."""
        ...


class ControlClient(Protocol):
    def send(self, address: PeerAddress, message: XferReq | XferDone) -> None:
        """Queue `message` for the producer at `address`; non-blocking.

        Delivery failures never raise here: an unreachable peer is reported by a later poll.
        """
        ...

    def poll(self) -> list[Reply]:
        """Replies and peer losses since the last poll; non-blocking; each returned once.

        A loss (`Reply(address, None)`) means no ack will come for what is in flight to that
        peer; acks that arrived before it come first. A later send connects afresh.
        """
        ...

    def wait(self, timeout_s: float) -> bool:
        """Block up to `timeout_s` until a reply or a peer's loss may be ready for `poll`.

        True at once when one is queued already, or as soon as one may have come; False when the
        time ran out, or at once when nothing is connected. It never consumes a reply.
        """
        ...

    def close(self) -> None:
        """Drop every connection; idempotent."""
        ...
