"""What crosses vLLM's process boundaries: small picklable values, never tensors.

`ECTierStats.data` travels from the engine core to the frontend (vLLM puts the plain dict into
`SchedulerStats.ec_connector_stats`). It holds three kinds of values, told apart by key:

- counters: increments since the previous report (int), summed by `aggregate`;
- levels (`LEVELS`, the fleet's directory records and live peers): changes since the previous
  report (int, maybe negative), summed by `aggregate` as counters are; a Prometheus gauge adds
  them up to the level. Reported only where the replica has fleet peers;
- gauges (`GAUGES`): the region's occupancy at report time (int), the latest value wins;
- samples (`SAMPLES`): durations in seconds observed since the previous report (list of float),
  concatenated by `aggregate`; Prometheus histograms observe each one.
"""

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


GAUGES = frozenset({"entries", "used_blocks", "free_blocks", "used_bytes", "capacity_bytes"})
LEVELS = frozenset({"fleet_directory_records", "fleet_peers_live"})
SAMPLES = frozenset({"save_seconds", "load_seconds", "peer_read_seconds", "peer_fetch_seconds"})


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class ECTierStats(ECConnectorStats):
    """Counter deltas, occupancy gauges and duration samples since the last report."""

    data: dict[str, Any] = field(default_factory=dict)

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: ECConnectorStats) -> ECConnectorStats:
        for key, value in other.data.items():
            if key in GAUGES:
                self.data[key] = value
            elif key in SAMPLES:
                self.data[key] = [*self.data.get(key, ()), *value]
            else:
                self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        """One line's worth: non-zero counters, the gauges, and count/mean/p50/p99/max per sample."""
        out: dict[str, int | float] = {}
        for key, value in sorted(self.data.items()):
            if key in GAUGES:
                out[key] = value
            elif key in SAMPLES:
                if value:
                    ordered = sorted(value)
                    name = key.removesuffix("_seconds")
                    out[f"{name}_count"] = len(ordered)
                    out[f"{name}_mean_ms"] = round(sum(ordered) / len(ordered) * 1e3, 3)
                    out[f"{name}_p50_ms"] = round(_quantile(ordered, 0.5) * 1e3, 3)
                    out[f"{name}_p99_ms"] = round(_quantile(ordered, 0.99) * 1e3, 3)
                    out[f"{name}_max_ms"] = round(ordered[-1] * 1e3, 3)
            elif value:
                out[key] = value
        return out

    def is_empty(self) -> bool:
        return not any(value for key, value in self.data.items() if key not in GAUGES)
