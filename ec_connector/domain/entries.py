"""An entry: one item's blocks in the region, and the lifecycle that guards them.

    NOT_READY --mark_ready--> READY <--pin/unpin, grant/release--> READY (pinned)
    NOT_READY --quarantine--> QUARANTINED --(settled by the table)--> freed

NOT_READY means bytes are still arriving (a local save or a peer READ) under a deadline (the save
lease). QUARANTINED blocks may still be written by a copy or DMA that was given up on, so they are
held, unusable, until their quarantine ends. A READY entry is evictable only when nothing pins it:
no local load, no producer grant (each grant is a pin with its own lease) and no live announcement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from ec_connector.domain.blocks import Extent, pack_extents, total_blocks
from ec_connector.domain.errors import IllegalTransition


class Phase(Enum):
    NOT_READY = "not_ready"
    READY = "ready"
    QUARANTINED = "quarantined"


@dataclass(eq=False, slots=True)
class Entry:
    key: str
    extents: tuple[Extent, ...]
    rows: int
    ready_deadline: float
    phase: Phase = Phase.NOT_READY
    pins: int = 0
    grants: dict[int, float] = field(default_factory=dict)
    announced_until: float = float("-inf")
    quarantined_until: float = float("-inf")
    order: int = 0  # place in the table's eviction queue (FIFO): set at reservation and re-set
    # when the entry's last pin or grant is released
    _packed: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        if self.rows <= 0:
            raise ValueError(f"entry {self.key!r} must hold at least one row, got {self.rows}")
        if total_blocks(self.extents) != self.rows:
            raise ValueError(
                f"entry {self.key!r} has {self.rows} rows but its extents cover "
                f"{total_blocks(self.extents)} blocks"
            )

    def packed_extents(self) -> bytes:
        """`pack_extents(extents)`, made on first use and kept: every copy of the entry carries it."""
        if not self._packed:
            self._packed = pack_extents(self.extents)
        return self._packed

    @property
    def is_ready(self) -> bool:
        return self.phase is Phase.READY

    @property
    def pin_count(self) -> int:
        """Local pins plus outstanding producer grants."""
        return self.pins + len(self.grants)

    @property
    def is_pinned(self) -> bool:
        return self.pin_count > 0

    def is_announced(self, now: float) -> bool:
        return now < self.announced_until

    def is_evictable(self, now: float) -> bool:
        return self.is_ready and not self.is_pinned and not self.is_announced(now)

    def mark_ready(self) -> None:
        self._require(Phase.NOT_READY, "mark ready")
        self.phase = Phase.READY

    def pin(self) -> None:
        self._require(Phase.READY, "pin")
        self.pins += 1

    def unpin(self) -> None:
        if self.pins <= 0:
            raise IllegalTransition(f"entry {self.key!r}: unpin without a matching pin")
        self.pins -= 1

    def grant(self, grant_id: int, deadline: float) -> None:
        self._require(Phase.READY, "grant a peer read")
        if grant_id in self.grants:
            raise IllegalTransition(f"entry {self.key!r}: grant {grant_id} already outstanding")
        self.grants[grant_id] = deadline

    def release_grant(self, grant_id: int) -> bool:
        """Ends grant `grant_id` (a READ finished or its lease ran out); False if unknown."""
        if self.grants.pop(grant_id, None) is None:
            return False
        if not self.grants:
            # The last outstanding read ended: the announcement has served its purpose.
            self.announced_until = float("-inf")
        return True

    def announce(self, until: float) -> None:
        if self.phase is Phase.QUARANTINED:
            raise IllegalTransition(f"entry {self.key!r}: a quarantined entry cannot be announced")
        self.announced_until = max(self.announced_until, until)

    def extend_ready_deadline(self, deadline: float) -> None:
        self._require(Phase.NOT_READY, "extend its save lease")
        self.ready_deadline = max(self.ready_deadline, deadline)

    def quarantine(self, until: float) -> None:
        self._require(Phase.NOT_READY, "quarantine")
        self.phase = Phase.QUARANTINED
        self.quarantined_until = until

    def _require(self, phase: Phase, action: str) -> None:
        if self.phase is not phase:
            raise IllegalTransition(
                f"entry {self.key!r}: cannot {action} in phase {self.phase.value} (needs {phase.value})"
            )
