"""The producer side of P2P: announce what can be served, answer peers, release their pins.

`answer` and `done` run on the control channel's I/O thread, so acks never wait for an engine
step; the tier scheduler grants and releases under its own lock. A granted read pins the entry
under a lease (`producer_pin_lease_s`), released by the consumer's XferDone or by expiry.

Each grant ends with exactly one INFO line, `peer_grant_settled`: `outcome=done` (the consumer's
XferDone) or `outcome=lease_lapsed` (no XferDone within the lease), with the item, the consumer,
the grant id, bytes, runs and how long the pin was held. Refusals are DEBUG lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from ec_connector.application.scheduler import Grant, TierScheduler
from ec_connector.application.stats import PeerStats
from ec_connector.domain.config import ConnectorConfig
from ec_connector.domain.protocol import PROTOCOL_VERSION, AckStatus, XferAck, XferDone, XferReq
from ec_connector.domain.publish import PeerAddress, publish
from ec_connector.logging import debug_enabled, log_context
from ec_connector.ports.runtime import Clock

log = structlog.get_logger(__name__)
_debug = debug_enabled(__name__)


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
        self.stats = stats
        tier.on_grant_lapsed(self._lapsed)

    def publish(self, items: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        """`ec_transfer_params` for a finished request's items (identifier → placeholder metadata).

        Items held in the tier (saved, or still saving) are announced, held for the config's
        `announce_hold_s` (until read) where that is above 0; the others are published without
        address (both halves or neither).
        """
        servable = self._tier.announce(items, lease_s=self._config.announce_hold_s)
        self.stats.announced += len(servable)
        self.stats.unservable += len(items) - len(servable)
        return publish(items, servable, self._address)

    def answer(self, req: XferReq) -> XferAck:
        """The ack for one request (thread-safe; called from the control channel's thread)."""
        with self._bound(req.mm_hash, req.consumer):
            status, grant = self._tier.grant(
                req, fingerprint=self._fingerprint, lease_s=self._config.producer_pin_lease_s
            )
            if grant is None:
                if _debug():
                    log.debug("peer_refused", status=status.value)
                return XferAck(PROTOCOL_VERSION, req.mm_hash, status)
            self.stats.grants += 1
            if _debug():
                log.debug("peer_granted", grant=grant.grant_id, runs=len(grant.runs))
        return XferAck(
            version=PROTOCOL_VERSION,
            mm_hash=req.mm_hash,
            status=AckStatus.OK,
            size_bytes=grant.size_bytes,
            rows=grant.rows,
            runs=grant.runs,
            grant_id=grant.grant_id,
            agent_name=self._agent_name,
            agent_metadata=self._agent_metadata,
        )

    def done(self, msg: XferDone) -> None:
        """A consumer's READ under `msg.grant_id` ended: release that pin (thread-safe)."""
        grant = self._tier.release_grant(msg.mm_hash, msg.grant_id)
        if grant is not None:
            self.stats.grants_released += 1
            self._settled(grant, "done")

    def _lapsed(self, grant: Grant) -> None:
        """The tier let `grant`'s pin lapse (called under the tier's lock)."""
        self._settled(grant, "lease_lapsed")

    def _settled(self, grant: Grant, outcome: str) -> None:
        with self._bound(grant.key, grant.holder):
            log.info(
                "peer_grant_settled",
                mm_hash=grant.key,
                peer=grant.holder,
                grant=grant.grant_id,
                outcome=outcome,
                bytes=grant.size_bytes,
                runs=len(grant.runs),
                held_ms=round((self._clock.now() - grant.granted_at) * 1000.0, 3),
            )

    def _bound(self, key: str, consumer: str) -> Any:
        """Log context of one peer request: the item, the consumer, this producer."""
        return log_context(
            role=self._config.role.value, engine_id=self._tier.engine_id, mm_hash=key, peer=consumer
        )
