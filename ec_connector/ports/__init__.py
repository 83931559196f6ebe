"""Ports: what the application needs from the world, as `typing.Protocol`s.

Each method's docstring is its contract: blocking or not, idempotent or not, who owns the result.
Ports speak domain values and primitives; payloads are opaque device buffers that only the copier
understands.
"""

from ec_connector.ports.control import ControlClient, ControlServer, Reply
from ec_connector.ports.copier import Copier
from ec_connector.ports.peer import PeerTransport, ReadState
from ec_connector.ports.region import Region
from ec_connector.ports.runtime import Clock, EventSink

__all__ = [
    "Clock",
    "ControlClient",
    "ControlServer",
    "Copier",
    "EventSink",
    "PeerTransport",
    "ReadState",
    "Region",
    "Reply",
]
