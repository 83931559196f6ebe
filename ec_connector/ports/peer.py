"""The P2P data plane: one-sided READs from a producer's registered region."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Protocol


class ReadState(Enum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class PeerTransport(Protocol):
    @property
    def agent_name(self) -> str:
        """This instance's data-plane identity (derived from engine_id)."""
        ...

    def agent_metadata(self) -> bytes:
        """What a peer needs to reach this agent and its registered region; owned by the caller."""
        ...

    def add_peer(self, name: str, metadata: bytes) -> None:
        """Register (or re-register, if `metadata` changed) a remote agent; idempotent; blocking."""
        ...

    def remove_peer(self, name: str) -> None:
        """Forget a remote agent (e.g. replaced by a restarted producer's): its pending READs end
        FAILED and new ones are refused until it is added again; idempotent; blocking."""
        ...

    def start_read(
        self,
        peer: str,
        remote_runs: Sequence[tuple[int, int]],
        local_runs: Sequence[tuple[int, int]],
    ) -> int:
        """Start a READ of remote (offset, length) runs into local runs of equal total; non-blocking.

        Returns a handle; raises ConnectionError if the peer is unknown or unreachable.
        """
        ...

    def read_state(self, handle: int) -> ReadState:
        """Progress of a READ; non-blocking."""
        ...

    def release(self, handle: int) -> None:
        """Forget a READ (aborting it if still pending); idempotent."""
        ...

    def close(self) -> None:
        """Release every READ, deregister the region, stop the agent; idempotent."""
        ...
