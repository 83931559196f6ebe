"""The producer side of P2P: announce what can be served, answer peers, release their pins.

`answer` and `done` run on the control channel's I/O thread, so acks never wait for an engine
step; they hold the tier's lock for the few table operations they make. A granted read pins the
entry under a lease (`producer_pin_lease_s`), released by the consumer's XferDone or by expiry.

Each grant ends with exactly one INFO line, `peer_grant_settled`: `outcome=done` (the consumer's
XferDone) or `outcome=lease_lapsed` (no XferDone within the lease), with the item, the consumer,
the grant id, bytes, runs and how long the pin was held. Refusals are DEBUG lines.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from ec_connector.application.scheduler import TierScheduler
from ec_connector.application.stats import PeerStats
from ec_connector.domain.config import ConnectorConfig
from ec_connector.domain.entries import Phase
from ec_connector.domain.protocol import (
    PROTOCOL_VERSION,
    AckStatus,
    XferAck,
    XferDone,
    XferReq,
    answer_status,
    fits_one_ack,
)
from ec_connector.domain.publish import PeerAddress, publish
from ec_connector.domain.transfers import EventKind
from ec_connector.logging import debug_enabled, log_context
from ec_connector.ports.runtime import Clock

log = structlog.get_logger(__name__)
_debug = debug_enabled(__name__)


@dataclass(frozen=True, slots=True)
class _Grant:
    key: str
    consumer: str
    granted_at: float
    size_bytes: int
    runs: int


class ProducerDesk:
    """Serves this instance's entries to consumers that ask for them."""

    def __init__(
        self,
        *,
        tier: TierScheduler,
        config: ConnectorConfig,
        clock: Clock,
        fingerprint: str,
        address: PeerAddress,
        agent_name: str,
        agent_metadata: bytes,
        stats: PeerStats,
    ) -> None:
        self._tier = tier
        self._config = config
        self._clock = clock
        self._fingerprint = fingerprint
        self._address = address
        self._agent_name = agent_name
        self._agent_metadata = agent_metadata
        self._grant_ids = itertools.count(1)
        self._grants: dict[int, _Grant] = {}
        self.stats = stats
        tier.on_grant_lapsed(self._lapsed)

    def publish(self, items: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        """`ec_transfer_params` for a finished request's items (identifier → placeholder metadata).

        Items held in the tier (saved, or still saving) are announced under a lease so they
        survive until read; the others are published without address (both halves or neither).
        """
        servable: dict[str, int] = {}
        tier, table = self._tier, self._tier.table
        block = tier.layout.block_size_bytes
        with tier.lock:
            now = self._clock.now()
            for key in items:
                entry = table.get(key)
                if entry is None or entry.phase is Phase.QUARANTINED or not fits_one_ack(entry):
                    self.stats.unservable += 1
                    continue
                table.announce(key, now=now, lease_s=self._config.announce_lease_s)
                servable[key] = entry.rows * block
                self.stats.announced += 1
                tier.publish_event(EventKind.ANNOUNCED, key, entry.rows)
        return publish(items, servable, self._address)

    def answer(self, req: XferReq) -> XferAck:
        """The ack for one request (thread-safe; called from the control channel's thread)."""
        tier, table = self._tier, self._tier.table
        with self._bound(req.mm_hash, req.consumer), tier.lock:
            entry = table.get(req.mm_hash)
            if entry is not None and entry.phase is Phase.NOT_READY:
                # The save may have landed since the engine last stepped (an idle engine does
                # not step): read the completion table before answering NOT_READY.
                tier.poll()
                entry = table.get(req.mm_hash)
            status = answer_status(req, fingerprint=self._fingerprint, entry=entry)
            if status is not AckStatus.OK or entry is None:
                if _debug():
                    log.debug("peer_refused", status=status.value)
                return XferAck(PROTOCOL_VERSION, req.mm_hash, status)
            grant_id = next(self._grant_ids)
            now = self._clock.now()
            table.grant(req.mm_hash, grant_id, now=now, lease_s=self._config.producer_pin_lease_s)
            self.stats.grants += 1
            runs = tier.layout.byte_runs(entry.extents)
            size = entry.rows * tier.layout.block_size_bytes
            self._grants[grant_id] = _Grant(req.mm_hash, req.consumer, now, size, len(runs))
            if _debug():
                log.debug("peer_granted", grant=grant_id, runs=len(runs))
        return XferAck(
            version=PROTOCOL_VERSION,
            mm_hash=req.mm_hash,
            status=AckStatus.OK,
            size_bytes=size,
            rows=entry.rows,
            runs=runs,
            grant_id=grant_id,
            agent_name=self._agent_name,
            agent_metadata=self._agent_metadata,
        )

    def done(self, msg: XferDone) -> None:
        """A consumer's READ under `msg.grant_id` ended: release that pin (thread-safe)."""
        with self._tier.lock:
            if self._tier.table.release_grant(msg.mm_hash, msg.grant_id):
                self.stats.grants_released += 1
                self._settled(msg.grant_id, "done")

    def _lapsed(self, key: str, grant_id: int) -> None:
        """The tier let the pin of `grant_id` lapse (called under the tier's lock)."""
        self._settled(grant_id, "lease_lapsed")

    def _settled(self, grant_id: int, outcome: str) -> None:
        grant = self._grants.pop(grant_id, None)
        if grant is None:
            return  # granted before a restart of this desk, or settled already
        with self._bound(grant.key, grant.consumer):
            log.info(
                "peer_grant_settled",
                mm_hash=grant.key,
                peer=grant.consumer,
                grant=grant_id,
                outcome=outcome,
                bytes=grant.size_bytes,
                runs=grant.runs,
                held_ms=round((self._clock.now() - grant.granted_at) * 1000.0, 3),
            )

    def _bound(self, key: str, consumer: str) -> Any:
        """Log context of one peer request: the item, the consumer, this producer."""
        return log_context(
            role=self._config.role.value, engine_id=self._tier.engine_id, mm_hash=key, peer=consumer
        )
