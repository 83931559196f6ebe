"""What crosses vLLM's process boundaries: small picklable values, never tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorMetadata
from vllm.distributed.ec_transfer.ec_connector.metrics import ECConnectorStats

from ec_connector.domain.transfers import StepPlan


@dataclass
class ECTierMetadata(ECConnectorMetadata):
    """Scheduler → workers: this step's copies."""

    plan: StepPlan = field(default_factory=StepPlan)


GAUGES = frozenset({"entries", "used_bytes", "capacity_bytes"})


@dataclass
class ECTierStats(ECConnectorStats):
    """Counter deltas since the last report, plus occupancy gauges (latest value wins)."""

    data: dict[str, Any] = field(default_factory=dict)

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: ECConnectorStats) -> ECConnectorStats:
        for key, value in other.data.items():
            if key in GAUGES:
                self.data[key] = value
            else:
                self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(v for k, v in self.data.items() if k not in GAUGES)
