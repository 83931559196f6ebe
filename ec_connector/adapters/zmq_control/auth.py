"""Optional shared-secret authentication of control frames.

With a secret configured, every ZMQ message carries a second part, the trailer:

    timestamp (8 bytes, big-endian nanoseconds since the epoch) | nonce (16 bytes) | MAC (32 bytes)
    MAC = HMAC-SHA256(secret, label | timestamp | nonce | payload)

`label` says which way the frame travels (requests vs acks), so a captured request cannot be
played back as an ack. A receiver refuses a frame whose MAC does not verify, whose timestamp is more
than `window_s` away from its own wall clock (hosts need clocks within that window), or whose nonce
it has already accepted inside that window (replay). Both ends must hold the same secret: an end
without one refuses authenticated frames too, so a half-configured pair fails closed and visibly
(the drop counters say `auth`) instead of serving anyone.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence

from .codec import FrameRejected

REQUEST = b"ec-control/request"
ACK = b"ec-control/ack"
DEFAULT_WINDOW_S = 30.0

_STAMP = struct.Struct(">Q")
_NONCE_BYTES = 16
_MAC_BYTES = hashlib.sha256().digest_size
TRAILER_BYTES = _STAMP.size + _NONCE_BYTES + _MAC_BYTES


class AuthFailure(FrameRejected):
    """A frame failed authentication: drop it and count it; check both ends hold the same secret."""

    reason = "auth"


class FrameAuth:
    """Seals outgoing payloads and checks incoming ones under one shared secret."""

    def __init__(
        self,
        secret: bytes | str,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        key = secret.encode() if isinstance(secret, str) else bytes(secret)
        if not key:
            raise ValueError("the side-channel secret is empty: give a non-empty secret or none at all")
        if not window_s > 0:
            raise ValueError(f"auth window_s must be > 0 seconds, got {window_s!r}")
        self._key = key
        self._window_ns = int(window_s * 1e9)
        self._clock = clock
        self._seen: set[bytes] = set()
        self._expiry: deque[tuple[int, bytes]] = deque()

    def seal(self, label: bytes, payload: bytes) -> bytes:
        """The trailer that authenticates `payload` travelling in direction `label`."""
        head = _STAMP.pack(self._now_ns()) + secrets.token_bytes(_NONCE_BYTES)
        return head + self._mac(label, head, payload)

    def check(self, label: bytes, payload: bytes, trailer: bytes) -> None:
        """Accept `payload` (remembering its nonce) or raise AuthFailure saying why."""
        if len(trailer) != TRAILER_BYTES:
            raise AuthFailure(f"authentication trailer of {len(trailer)} bytes, expected {TRAILER_BYTES}")
        head, mac = trailer[:-_MAC_BYTES], trailer[-_MAC_BYTES:]
        if not hmac.compare_digest(mac, self._mac(label, head, payload)):
            raise AuthFailure("frame MAC does not verify: the peer holds another secret (or none)")
        now = self._now_ns()
        (stamp,) = _STAMP.unpack_from(head)
        if abs(now - stamp) > self._window_ns:
            raise AuthFailure(
                f"frame stamped {(now - stamp) / 1e9:+.1f} s from now, outside the "
                f"{self._window_ns / 1e9:g} s window: replayed, or the hosts' clocks disagree"
            )
        self._forget_before(now)
        nonce = head[_STAMP.size :]
        if nonce in self._seen:
            raise AuthFailure("frame nonce already seen inside the window: a replay")
        self._seen.add(nonce)
        self._expiry.append((stamp + self._window_ns, nonce))

    def _mac(self, label: bytes, head: bytes, payload: bytes) -> bytes:
        return hmac.new(self._key, label + head + payload, hashlib.sha256).digest()

    def _now_ns(self) -> int:
        return int(self._clock() * 1e9)

    def _forget_before(self, now: int) -> None:
        # A nonce can only be replayed while its stamp is inside the window; forget it afterwards.
        while self._expiry and self._expiry[0][0] < now:
            self._seen.discard(self._expiry.popleft()[1])


def seal(auth: FrameAuth | None, label: bytes, payload: bytes) -> list[bytes]:
    """The message parts that carry `payload`: the payload, plus the trailer when authenticating."""
    return [payload] if auth is None else [payload, auth.seal(label, payload)]


def unseal(auth: FrameAuth | None, label: bytes, parts: Sequence[bytes]) -> bytes:
    """The payload of a received message, or FrameRejected/AuthFailure saying why not."""
    if auth is None:
        if len(parts) == 2:
            raise AuthFailure("peer authenticates its frames but no secret is configured here")
        if len(parts) != 1:
            raise FrameRejected(f"message of {len(parts)} parts, expected 1")
        return parts[0]
    if len(parts) == 1:
        raise AuthFailure("unauthenticated frame, but a secret is configured here")
    if len(parts) != 2:
        raise FrameRejected(f"message of {len(parts)} parts, expected 2 (payload, trailer)")
    auth.check(label, parts[0], parts[1])
    return parts[0]
