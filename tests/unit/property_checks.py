"""What the property tests share: their Hypothesis budget and the checks on blocks and free extents."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from ec_connector.domain.blocks import Extent

# EC_FUZZ_EXAMPLES (the fuzz suite's long-run budget, docs/reliability.md) raises the budget here too.
SETTINGS = settings(
    max_examples=int(os.environ.get("EC_FUZZ_EXAMPLES") or 250),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def blocks_of(extents) -> list[int]:
    """Every block index the extents cover, in order."""
    return [b for e in extents for b in range(e.start, e.end)]


def assert_maximal(free: tuple[Extent, ...]) -> None:
    """Free extents never touch nor overlap: each free run is as long as it can be."""
    for a, b in zip(free, free[1:], strict=False):
        assert a.end < b.start, f"free extents {a} and {b} touch or overlap"
