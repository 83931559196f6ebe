"""`ec_transfer_params`: what a producer announces per item, with the both-or-neither rule.

An item the producer can serve is published with its metadata AND its address; an item it cannot
serve is published with `metadata={}` and no address, so an orchestrator keeps the media in the
request and the consumer encodes locally. A consumer reading params accepts only those two forms.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ec_connector.domain.errors import ProtocolError
from ec_connector.domain.protocol import MAX_KEY_CHARS

_ADDRESS_KEYS = ("peer_host", "peer_port", "size_bytes")


@dataclass(frozen=True, slots=True)
class PeerAddress:
    host: str
    port: int

    def __post_init__(self) -> None:
        if not self.host or not 0 < self.port < 65536:
            raise ValueError(f"peer address {self.host!r}:{self.port} is not host:port (1-65535)")


@dataclass(frozen=True, slots=True)
class PeerRef:
    """A published item a consumer may pull from `address`."""

    mm_hash: str
    address: PeerAddress
    size_bytes: int
    metadata: Mapping[str, Any]


def publish(
    items: Mapping[str, Mapping[str, Any]],
    servable: Mapping[str, int],
    address: PeerAddress,
) -> dict[str, dict[str, Any]]:
    """Params for `items` (mm_hash → placeholder metadata); `servable` maps mm_hash → size_bytes."""
    out: dict[str, dict[str, Any]] = {}
    for mm_hash, metadata in items.items():
        size = servable.get(mm_hash)
        if size is not None and size <= 0:
            raise ValueError(f"servable item {mm_hash!r} must have size_bytes > 0, got {size}")
        if size is None:
            out[mm_hash] = {"metadata": {}}
        else:
            out[mm_hash] = {
                "metadata": dict(metadata),
                "peer_host": address.host,
                "peer_port": address.port,
                "size_bytes": size,
            }
    return out


def parse_transfer_params(raw: object) -> dict[str, PeerRef | None]:
    """Read params forwarded to a consumer: mm_hash → PeerRef, or None for "encode locally".

    Raises ProtocolError naming the item and the field when an item is neither form.
    """
    if not isinstance(raw, Mapping):
        raise ProtocolError(f"ec_transfer_params must be a mapping of mm_hash to item, got {raw!r}")
    out: dict[str, PeerRef | None] = {}
    for mm_hash, item in raw.items():
        if not isinstance(mm_hash, str) or not 0 < len(mm_hash) <= MAX_KEY_CHARS:
            raise ProtocolError(f"ec_transfer_params key {mm_hash!r} is not an mm_hash string")
        out[mm_hash] = _parse_item(mm_hash, item)
    return out


def _parse_item(mm_hash: str, item: object) -> PeerRef | None:
    if not isinstance(item, Mapping):
        raise ProtocolError(f"ec_transfer_params[{mm_hash!r}] must be a mapping, got {item!r}")
    metadata = item.get("metadata", {})
    if not isinstance(metadata, Mapping):
        raise ProtocolError(f"ec_transfer_params[{mm_hash!r}]['metadata'] must be a mapping")
    present = [k for k in _ADDRESS_KEYS if k in item]
    if not present:
        if metadata:
            raise ProtocolError(
                f"ec_transfer_params[{mm_hash!r}] has metadata but no peer_host/peer_port/"
                "size_bytes: both halves or neither"
            )
        return None
    missing = [k for k in _ADDRESS_KEYS if k not in item]
    if missing:
        raise ProtocolError(f"ec_transfer_params[{mm_hash!r}] lacks {', '.join(missing)}")
    host, port, size = item["peer_host"], item["peer_port"], item["size_bytes"]
    if not isinstance(host, str) or not host:
        raise ProtocolError(f"ec_transfer_params[{mm_hash!r}]['peer_host'] = {host!r} is not a host")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ProtocolError(f"ec_transfer_params[{mm_hash!r}]['peer_port'] = {port!r} is not 1-65535")
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ProtocolError(f"ec_transfer_params[{mm_hash!r}]['size_bytes'] = {size!r} is not > 0")
    return PeerRef(mm_hash, PeerAddress(host, port), size, dict(metadata))
