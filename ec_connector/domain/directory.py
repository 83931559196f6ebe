"""The peer directory: which peers of the fleet hold which entries, as their event feeds tell.

Peers join (from a static peer list, or the first frame of their feed that names their side
channel), then report `stored` and `evicted` entries and beat; a peer that leaves (its feed
disconnected) or stops beating (`drop_silent`) drops out of `locate` at once. An `expired` event
(an announcement's lease ended) leaves the entry in place: the holder still has it READY until it
is evicted. A directory entry can still be stale (a missed `evicted` event, a feed gap): the pull
it leads to is answered NACK_MISSING and falls back, and the caller then `forget`s that record.

Keys are the tier's entry keys (`domain/scope.py`): a scoped key names its scope, so a lookup
made under one scope never finds an entry stored under another.

Memory is bounded by `DirectoryLimits`: each peer's records are capped (its oldest dropped first),
all records together are capped (the oldest of the whole directory dropped first), and so is the
number of peers (a join past it is refused). A record costs about 0.7 KiB with its 64-character
key string (`bench/directory.py`; docs/fleet.md), so the defaults (65,536 per peer, 262,144 in
all) hold at most ~180 MiB; size them from the peers' regions (entries a peer can hold = its
`ec_cpu_bytes` / its typical entry size).

Threads: one thread writes (every method but the reads); `locate` may be called from any other
thread without a lock. Each write is a sequence of single dict
operations, each atomic in CPython, and `locate` checks its answer against the live peer table,
which `leave` changes first: a departed or restarted peer is never returned once `leave` (or the
join that replaces it) has begun. No method reads a clock: times are passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

from ec_connector.domain.protocol import MAX_KEY_CHARS
from ec_connector.domain.publish import PeerAddress
from ec_connector.domain.scope import Scope, entry_key


@dataclass(frozen=True, slots=True)
class Peer:
    """A replica that serves its entries: its feed's engine id, its side channel, and its boot (a
    restarted peer joins with a new boot: its old entries are gone with its old region)."""

    peer_id: str
    address: PeerAddress
    boot: str = ""


class Holder(NamedTuple):
    """Where an entry can be pulled from: the peer, and the entry's size there.

    A named tuple, as `CacheEvent`: one is made per stored event, on the subscriber's thread, and
    a frozen dataclass costs about twice as much to make."""

    peer: Peer
    size_bytes: int


@dataclass(frozen=True, slots=True)
class DirectoryLimits:
    max_entries_per_peer: int = 65_536
    max_entries: int = 262_144
    max_peers: int = 256

    def __post_init__(self) -> None:
        for name in ("max_entries_per_peer", "max_entries", "max_peers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"directory limit {name} = {value!r} must be an int > 0")


class PeerDirectory:
    """Peers and the entry keys each holds; `locate(key)` is one dict read and a check."""

    def __init__(self, limits: DirectoryLimits | None = None) -> None:
        self.limits = limits or DirectoryLimits()
        self._peers: dict[str, Peer] = {}
        self._seen: dict[str, float] = {}
        self._held: dict[str, OrderedDict[str, int]] = {}  # peer id -> key -> size, oldest first
        self._holders: dict[str, dict[str, int]] = {}  # key -> peer id -> size, latest last
        self._where: dict[str, Holder] = {}  # key -> its latest holder (what locate reads)
        self._order: OrderedDict[tuple[str, str], None] = OrderedDict()  # every record, oldest first
        self.dropped_for_limits = 0
        self.refused = 0

    # -- reads (any thread) -----------------------------------------------------------------

    def locate(self, key: str) -> Holder | None:
        """A live peer that holds entry `key`, or None. Lock-free: see the module's docstring."""
        holder = self._where.get(key)
        if holder is None or self._peers.get(holder.peer.peer_id) is not holder.peer:
            return None
        return holder

    def locate_item(self, identifier: str, scope: Scope | None) -> Holder | None:
        """`locate` of the entry vLLM's item `identifier` has under `scope`."""
        return self.locate(entry_key(identifier, scope))

    def __len__(self) -> int:
        """Records (peer, key) held."""
        return len(self._order)

    def peers(self) -> tuple[Peer, ...]:
        return tuple(self._peers.values())

    def peer(self, peer_id: str) -> Peer | None:
        """The live peer named `peer_id`, or None."""
        return self._peers.get(peer_id)

    def holders(self, key: str) -> tuple[str, ...]:
        """Peer ids holding `key`, oldest record first."""
        return tuple(self._holders.get(key, ()))

    def entries_of(self, peer_id: str) -> int:
        return len(self._held.get(peer_id, ()))

    # -- writes (one thread) ----------------------------------------------------------------

    def join(self, peer: Peer, *, now: float) -> bool:
        """Add `peer` (or note that it beats, when it is already here as the same value). A peer id
        already here with another address or boot is a restart: its old records go first. False
        when `max_peers` peers are here already (refused, counted)."""
        current = self._peers.get(peer.peer_id)
        if current == peer:
            self._seen[peer.peer_id] = now
            return True
        if current is not None:
            self.leave(peer.peer_id)
        elif len(self._peers) >= self.limits.max_peers:
            self.refused += 1
            return False
        self._held[peer.peer_id] = OrderedDict()
        self._seen[peer.peer_id] = now
        self._peers[peer.peer_id] = peer
        return True

    def heartbeat(self, peer_id: str, *, now: float) -> bool:
        """Note that `peer_id` is alive at `now`; False for a peer that is not here."""
        if peer_id not in self._peers:
            return False
        self._seen[peer_id] = now
        return True

    def stored(self, peer_id: str, key: str, size_bytes: int) -> bool:
        """`peer_id` holds entry `key` of `size_bytes` (stored, or announced). False (counted as
        refused) for an unknown peer, an empty or over-long key, or a size that is not > 0."""
        held = self._held.get(peer_id)
        if held is None or not 0 < len(key) <= MAX_KEY_CHARS or size_bytes <= 0:
            self.refused += 1
            return False
        peer = self._peers[peer_id]
        if key in held:
            self._unlink(peer_id, key)
        held[key] = size_bytes
        holders = self._holders.setdefault(key, {})
        holders[peer_id] = size_bytes
        self._order[(peer_id, key)] = None
        self._where[key] = Holder(peer, size_bytes)
        if len(held) > self.limits.max_entries_per_peer:
            self._unlink(peer_id, next(iter(held)))
            self.dropped_for_limits += 1
        if len(self._order) > self.limits.max_entries:
            self._unlink(*next(iter(self._order)))
            self.dropped_for_limits += 1
        return True

    def evicted(self, peer_id: str, key: str) -> bool:
        """`peer_id` no longer holds `key` (evicted there, or found missing); False if not recorded."""
        if key not in self._held.get(peer_id, ()):
            return False
        self._unlink(peer_id, key)
        return True

    forget = evicted

    def leave(self, peer_id: str) -> int:
        """Drop `peer_id` and every record of it (its feed disconnected, or it restarted); the
        number of records dropped. `locate` stops returning it before any record goes."""
        if self._peers.pop(peer_id, None) is None:
            return 0
        self._seen.pop(peer_id, None)
        held = self._held.get(peer_id, OrderedDict())
        count = len(held)
        for key in list(held):
            self._unlink(peer_id, key)
        self._held.pop(peer_id, None)
        return count

    def drop_silent(self, *, now: float, timeout_s: float) -> list[str]:
        """Drop every peer not heard from for more than `timeout_s` before `now`; their ids."""
        silent = [peer_id for peer_id, seen in self._seen.items() if now - seen > timeout_s]
        for peer_id in silent:
            self.leave(peer_id)
        return silent

    def _unlink(self, peer_id: str, key: str) -> None:
        """Remove the record (peer_id, key) from every index; `_where[key]` moves to the latest
        remaining holder, or goes."""
        held = self._held.get(peer_id)
        if held is not None:
            held.pop(key, None)
        self._order.pop((peer_id, key), None)
        holders = self._holders.get(key)
        if holders is None:
            return
        holders.pop(peer_id, None)
        if not holders:
            del self._holders[key]
            self._where.pop(key, None)
            return
        latest = next(reversed(holders))
        where = self._where.get(key)
        if where is None or where.peer.peer_id != latest:
            peer = self._peers.get(latest)
            if peer is not None:
                self._where[key] = Holder(peer, holders[latest])
