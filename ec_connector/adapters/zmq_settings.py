"""The ZMQ adapters' settings: the side channel's shared secret and address (VLLM_EC_SIDE_CHANNEL_*),
and the event feed's address. Parsed with the domain's helpers, so errors read as the tier's do.

They live outside the `zmq_control` package because importing that package imports zmq, and local
mode must parse its configuration without loading zmq.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ec_connector.domain.config import EXTRA, parse_optional_text, rank_port
from ec_connector.domain.errors import ConfigError

KEYS = frozenset({"side_channel_secret", "event_feed_address"})
DEFAULT_SIDE_CHANNEL_HOST = "localhost"
DEFAULT_SIDE_CHANNEL_PORT = 5601


@dataclass(frozen=True, slots=True)
class ZmqSettings:
    side_channel_secret: str | None = None
    """Shared secret of the side channel's frames (HMAC); None: unauthenticated."""
    event_feed_address: str | None = None
    """Where the cache-event feed binds (data-parallel rank 0; see `feed_endpoint`); None: no feed."""

    def feed_endpoint(self, dp_rank: int) -> str | None:
        """The event feed endpoint of data-parallel rank `dp_rank`, or None without a feed."""
        if self.event_feed_address is None:
            return None
        return endpoint_for_rank(self.event_feed_address, dp_rank)


def parse_zmq_settings(extra: Mapping[str, Any]) -> ZmqSettings:
    """The ZMQ keys of `extra` (already known to be a mapping); absent keys take the defaults."""
    fields: dict[str, Any] = {}
    if "side_channel_secret" in extra:
        fields["side_channel_secret"] = parse_optional_text(
            "side_channel_secret", extra["side_channel_secret"], "a non-empty string or null"
        )
    if "event_feed_address" in extra:
        fields["event_feed_address"] = parse_optional_text(
            "event_feed_address",
            extra["event_feed_address"],
            'a ZMQ endpoint string such as "tcp://127.0.0.1:5610", or null',
        )
    return ZmqSettings(**fields)


def endpoint_for_rank(address: str, dp_rank: int) -> str:
    """The event feed endpoint of data-parallel rank `dp_rank`: each rank's scheduler publishes its
    own feed, so rank r > 0 binds a tcp port + r (port 0 or "*" stays: any free port) or, for other
    transports (ipc, inproc), the address with "_dp{r}" appended (vLLM's KV event publisher offsets
    its endpoint the same way)."""
    if dp_rank == 0:
        return address
    if not address.startswith("tcp://"):
        return f"{address}_dp{dp_rank}"
    base, _, port = address.rpartition(":")
    if not port.isdigit():  # "*": any free port
        return address
    setting = f"{EXTRA}['event_feed_address'] = {address!r}"
    return f"{base}:{rank_port(int(port), dp_rank, setting)}"


@dataclass(frozen=True, slots=True)
class SideChannel:
    """Where a producer's control server listens; port 0: any free port (it advertises the one it got)."""

    host: str = DEFAULT_SIDE_CHANNEL_HOST
    port: int = DEFAULT_SIDE_CHANNEL_PORT

    def for_rank(self, dp_rank: int) -> SideChannel:
        """The channel of data-parallel rank `dp_rank`: each rank's scheduler runs its own server, at
        port + rank (as vLLM's NIXL KV connector offsets its side channel), so that the ranks of one
        host do not collide; port 0 stays 0."""
        port = rank_port(self.port, dp_rank, f"VLLM_EC_SIDE_CHANNEL_PORT = {self.port}")
        return self if port == self.port else SideChannel(self.host, port)


def side_channel_from_env(environ: Mapping[str, str]) -> SideChannel:
    """VLLM_EC_SIDE_CHANNEL_HOST / _PORT, read by producers (and ec_both) with NIXL on."""
    host = environ.get("VLLM_EC_SIDE_CHANNEL_HOST", DEFAULT_SIDE_CHANNEL_HOST).strip()
    if not host:
        raise ConfigError("VLLM_EC_SIDE_CHANNEL_HOST is empty: expected a host name or address")
    raw_port = environ.get("VLLM_EC_SIDE_CHANNEL_PORT", str(DEFAULT_SIDE_CHANNEL_PORT))
    port = int(raw_port) if raw_port.isascii() and raw_port.isdigit() else -1
    if not 0 <= port < 65536:
        raise ConfigError(
            f"VLLM_EC_SIDE_CHANNEL_PORT = {raw_port!r} is invalid: expected an integer port 0-65535 "
            "(0: any free port)"
        )
    return SideChannel(host, port)
