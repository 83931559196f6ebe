"""Socket settings both ends share: endpoints, heartbeats, the hard size cap, drop accounting."""

from __future__ import annotations

from dataclasses import dataclass

import structlog
import zmq

from .codec import MAX_FRAME_BYTES

log = structlog.get_logger(__name__)

HARD_MAX_MESSAGE_BYTES = 2 * MAX_FRAME_BYTES
"""ZMQ_MAXMSGSIZE: a peer sending a larger part is disconnected by ZMQ before it is buffered.

Parts between MAX_FRAME_BYTES and this cap reach the codec and are dropped and counted as
`oversized`; beyond it the connection itself is cut (memory stays bounded either way).
"""

DROP_REASONS = ("malformed", "oversized", "auth", "version", "unexpected", "unsent")


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """ZMTP heartbeats: PING every `ivl_s`; no traffic `timeout_s` after a PING ends the connection;
    `ttl_s` asks the remote end to drop us after that long without traffic."""

    ivl_s: float = 2.0
    timeout_s: float = 4.0
    ttl_s: float = 8.0

    def __post_init__(self) -> None:
        if not self.ivl_s > 0 or not self.timeout_s > 0:
            raise ValueError(
                f"heartbeat interval and timeout must be > 0 s, got {self.ivl_s}, {self.timeout_s}"
            )
        if not 0.1 <= self.ttl_s <= 6553.0:
            raise ValueError(
                f"heartbeat TTL must be within 0.1-6553 s (ZMTP carries deciseconds), got {self.ttl_s}"
            )

    def apply(self, sock: zmq.Socket) -> None:
        sock.setsockopt(zmq.HEARTBEAT_IVL, _ms(self.ivl_s))
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, _ms(self.timeout_s))
        sock.setsockopt(zmq.HEARTBEAT_TTL, _ms(self.ttl_s))


DEFAULT_HEARTBEAT = Heartbeat()


def tcp_endpoint(host: str, port: int) -> tuple[str, bool]:
    """The ZMQ endpoint for host:port and whether it needs IPv6 (a literal IPv6 address)."""
    if ":" in host:
        return f"tcp://[{host.strip('[]')}]:{port}", True
    return f"tcp://{host}:{port}", False


def common_options(sock: zmq.Socket, *, ipv6: bool, hwm: int) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, HARD_MAX_MESSAGE_BYTES)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    if ipv6:
        sock.setsockopt(zmq.IPV6, 1)


class DropCounter:
    """Counts dropped frames by reason and logs the 1st, 2nd, 4th, 8th… of each, not every one."""

    def __init__(self, side: str) -> None:
        self._side = side
        self.counts: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)

    def drop(self, reason: str, detail: object, **context: object) -> None:
        count = self.counts.get(reason, 0) + 1
        self.counts[reason] = count
        if count & (count - 1) == 0:
            log.warning(
                "control_frame_dropped",
                side=self._side,
                reason=reason,
                count=count,
                detail=str(detail),
                **context,
            )


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
