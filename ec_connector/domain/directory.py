"""The peer directory: which peers of the fleet hold which entries, as their event feeds tell.

Peers join (from a static peer list, or the hello frame of their feed that names their side
channel and boot), then report `stored` and `evicted` entries and beat; a peer that departs (its
feed disconnected) or stops beating (`drop_silent`) drops out of `locate` at once. An `expired` event
(an announcement's lease ended) leaves the entry in place: the holder still has it READY until it
is evicted. A directory entry can still be stale (a missed `evicted` event, a feed gap): the pull
it leads to is answered NACK_MISSING and falls back, and the caller then `forget`s that record.

A peer's boot (random per process start, told by its hello frames; "" while unknown) tells a
restart from a reconnect. A departing peer whose boot is known is kept *away*: hidden from
`locate`, its records kept for one more timeout. It returns with the same boot and address
(`Joined.RETURNED`: the same process reconnected, its records are served again), or with another
boot (`Joined.RESTARTED`: its old region is gone, its records are dropped at once, also when it
comes back without the feed having disconnected). Seen again without a boot while away (its
handshake, before its hello) it stays away until its hello tells (`Joined.WAITING`). A boot first
learnt for a live peer whose boot was unknown is no restart: the peer keeps its records. A peer
whose boot is not known (a publisher without hello frames) loses its records when it departs, as
a restart could not be told from a reconnect.

Keys are the tier's entry keys (`domain/scope.py`): a scoped key names its scope, so a lookup
made under one scope never finds an entry stored under another.

Memory is bounded by `DirectoryLimits`: each peer's records are capped (its oldest dropped first),
all records together are capped (the oldest of the whole directory dropped first), and so is the
number of peers, away ones included (a join past it is refused). A record costs about 0.7 KiB
with its 64-character key string (`bench/directory.py`; docs/fleet.md), so the defaults (65,536
per peer, 262,144 in all) hold at most ~180 MiB; size them from the peers' regions (entries a
peer can hold = its `ec_cpu_bytes` / its typical entry size).

Threads: one thread writes (every method but the reads); `locate` may be called from any other
thread without a lock. Each write is a sequence of single dict
operations, each atomic in CPython, and `locate` checks its answer against the live peer table,
which `leave` and `depart` change first: a departed or restarted peer is never returned once
`leave`, `depart` (or the join that replaces it) has begun. No method reads a clock: times are
passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum
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


def same_process(a: Peer, b: Peer) -> bool:
    """True when `a` and `b` can be one process: same id and address, and boots equal or one of
    them unknown (a restart changes the boot; a reconnect or a boot first told does not)."""
    boots_agree = not a.boot or not b.boot or a.boot == b.boot
    return a.peer_id == b.peer_id and a.address == b.address and boots_agree


class Joined(Enum):
    """What `PeerDirectory.join` did."""

    NEW = "new"  # a peer not here before: joined with no records
    BEAT = "beat"  # already here as the same process: noted alive (its boot learnt if it was unknown)
    RETURNED = "returned"  # back from away with the same boot and address: its kept records are served again
    RESTARTED = "restarted"  # here or away with another boot or address: its old records dropped, joined anew
    WAITING = "waiting"  # away, seen without a boot: stays away until its hello tells the boot
    REFUSED = "refused"  # `max_peers` peers (away ones included) are here already: not joined, counted


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
        self._peers: dict[str, Peer] = {}  # live peers: what locate answers
        self._away: dict[str, Peer] = {}  # departed peers of known boot whose records are kept
        self._seen: dict[str, float] = {}  # live: last heard; away: when it departed
        self._held: dict[str, OrderedDict[str, int]] = {}  # peer id -> key -> size, oldest first
        self._holders: dict[str, dict[str, int]] = {}  # key -> peer id -> size, latest last
        self._where: dict[str, Holder] = {}  # key -> its latest live holder (what locate reads)
        self._order: OrderedDict[tuple[str, str], None] = OrderedDict()  # every record, oldest first
        self.dropped_for_limits = 0
        self.refused = 0
        self.away_expired = 0

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
        """The live peers."""
        return tuple(self._peers.values())

    def away(self) -> tuple[Peer, ...]:
        """The departed peers whose records are kept until they return or their time runs out."""
        return tuple(self._away.values())

    def peer(self, peer_id: str) -> Peer | None:
        """The live peer named `peer_id`, or None."""
        return self._peers.get(peer_id)

    def holders(self, key: str) -> tuple[str, ...]:
        """Peer ids holding `key`, oldest record first."""
        return tuple(self._holders.get(key, ()))

    def entries_of(self, peer_id: str) -> int:
        return len(self._held.get(peer_id, ()))

    # -- writes (one thread) ----------------------------------------------------------------

    def join(self, peer: Peer, *, now: float) -> Joined:
        """Add `peer`, or note that it beats; what happened (`Joined`, the module's docstring gives
        the rule). A restart drops the old records before the new peer is live."""
        peer_id = peer.peer_id
        current = self._peers.get(peer_id)
        if current is not None:
            if same_process(current, peer):
                if peer.boot and not current.boot:
                    self._adopt(peer)
                self._seen[peer_id] = now
                return Joined.BEAT
            self.leave(peer_id)
            joined = Joined.RESTARTED
        elif (away := self._away.get(peer_id)) is not None:
            if not peer.boot and away.address == peer.address:
                return Joined.WAITING
            if away == peer:
                self._return(away, now)
                return Joined.RETURNED
            self.leave(peer_id)
            joined = Joined.RESTARTED
        elif len(self._peers) + len(self._away) >= self.limits.max_peers:
            self.refused += 1
            return Joined.REFUSED
        else:
            joined = Joined.NEW
        self._held[peer_id] = OrderedDict()
        self._seen[peer_id] = now
        self._peers[peer_id] = peer
        return joined

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
        peer = self._peers.get(peer_id)
        if held is None or peer is None or not 0 < len(key) <= MAX_KEY_CHARS or size_bytes <= 0:
            self.refused += 1
            return False
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
        """Drop `peer_id` (live or away) and every record of it; the number of records dropped.
        `locate` stops returning it before any record goes."""
        if self._peers.pop(peer_id, None) is None and self._away.pop(peer_id, None) is None:
            return 0
        self._away.pop(peer_id, None)
        self._seen.pop(peer_id, None)
        held = self._held.get(peer_id, OrderedDict())
        count = len(held)
        for key in list(held):
            self._unlink(peer_id, key)
        self._held.pop(peer_id, None)
        return count

    def depart(self, peer_id: str, *, now: float) -> int:
        """`peer_id` went away (its feed disconnected, or it fell silent): `locate` stops returning
        it at once. Of known boot, it is kept away with its records (0 returned); of unknown boot,
        it leaves (the number of records dropped)."""
        peer = self._peers.get(peer_id)
        if peer is None:
            return 0
        if not peer.boot:
            return self.leave(peer_id)
        del self._peers[peer_id]
        self._away[peer_id] = peer
        self._seen[peer_id] = now
        for key in self._held[peer_id]:
            where = self._where.get(key)
            if where is not None and where.peer is peer:
                self._relocate(key)
        return 0

    def drop_silent(self, *, now: float, timeout_s: float) -> list[str]:
        """Depart every live peer not heard from for more than `timeout_s` before `now` (their ids),
        and drop the records of every peer away for more than `timeout_s` (counted)."""
        for peer_id in [p for p in self._away if now - self._seen[p] > timeout_s]:
            self.leave(peer_id)
            self.away_expired += 1
        silent = [p for p in self._peers if now - self._seen[p] > timeout_s]
        for peer_id in silent:
            self.depart(peer_id, now=now)
        return silent

    def _adopt(self, peer: Peer) -> None:
        """The live peer `peer.peer_id` is `peer` from now (its boot learnt): its records point at
        the new value. Until each is rewritten a `locate` of it answers None (a miss, not a wrong
        holder)."""
        old = self._peers[peer.peer_id]
        self._peers[peer.peer_id] = peer
        for key, size in self._held[peer.peer_id].items():
            where = self._where.get(key)
            if where is not None and where.peer is old:
                self._where[key] = Holder(peer, size)

    def _return(self, peer: Peer, now: float) -> None:
        """The away `peer` is live again, as the same value (so its kept records are valid)."""
        del self._away[peer.peer_id]
        self._seen[peer.peer_id] = now
        self._peers[peer.peer_id] = peer
        for key in self._held[peer.peer_id]:
            self._relocate(key)

    def _relocate(self, key: str) -> None:
        """`_where[key]` := the latest live holder of `key`, or nothing."""
        holders = self._holders.get(key, {})
        for peer_id in reversed(holders):
            peer = self._peers.get(peer_id)
            if peer is not None:
                self._where[key] = Holder(peer, holders[peer_id])
                return
        self._where.pop(key, None)

    def _unlink(self, peer_id: str, key: str) -> None:
        """Remove the record (peer_id, key) from every index; `_where[key]` moves to the latest
        remaining live holder, or goes."""
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
        where = self._where.get(key)
        if where is None or where.peer.peer_id == peer_id:
            self._relocate(key)
