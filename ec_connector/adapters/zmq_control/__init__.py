"""The ZMQ control-plane adapter: the ControlServer and ControlClient ports over ZMQ and msgspec.

Imported only where P2P is enabled (the container's factory), never by local mode. See codec.py
for the frame format, auth.py for the optional shared secret, server.py (producer, ROUTER + I/O
thread) and client.py (consumer, one DEALER per producer, heartbeats and peer-loss detection).
"""

from .auth import AuthFailure, FrameAuth
from .client import ZmqControlClient
from .codec import MAX_FRAME_BYTES, FrameRejected, OversizedFrame, UnexpectedMessage, VersionMismatch
from .server import ControlBindError, ZmqControlServer
from .sockets import DROP_REASONS, Heartbeat

__all__ = [
    "DROP_REASONS",
    "MAX_FRAME_BYTES",
    "AuthFailure",
    "ControlBindError",
    "FrameAuth",
    "FrameRejected",
    "Heartbeat",
    "OversizedFrame",
    "UnexpectedMessage",
    "VersionMismatch",
    "ZmqControlClient",
    "ZmqControlServer",
]
