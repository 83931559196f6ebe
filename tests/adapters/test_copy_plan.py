"""The CPU engine's batch plan (adapters/torch_copy/plan.py) against a plain-Python reference.

The CUDA engine's compiled plan (joining, the copy-engine/kernel split) is tested in test_batch_plan.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ec_connector.adapters.torch_copy.plan import plan_runs
from ec_connector.domain.blocks import Extent
from ec_connector.domain.errors import LayoutMismatch
from ec_connector.domain.transfers import PlannedCopy

NUM_BLOCKS = 4096

extent_lists = st.lists(
    st.lists(
        st.tuples(st.integers(0, NUM_BLOCKS - 64), st.integers(1, 64)).map(lambda t: Extent(*t)),
        min_size=1,
        max_size=6,
    ),
    max_size=40,
)


def copies_of(extents: list[list[Extent]]) -> list[PlannedCopy]:
    return [
        PlannedCopy(i + 1, f"e{i}", tuple(ext), sum(e.length for e in ext)) for i, ext in enumerate(extents)
    ]


@settings(max_examples=300, deadline=None)
@given(extent_lists)
def test_plan_matches_the_reference_flattening(extents: list[list[Extent]]) -> None:
    copies = copies_of(extents)
    runs = plan_runs(copies, NUM_BLOCKS)
    flat = [e for ext in extents for e in ext]
    assert runs.tickets == [c.ticket for c in copies]
    assert runs.rows == [c.rows for c in copies]
    assert runs.counts.tolist() == [len(ext) for ext in extents]
    assert runs.starts.tolist() == [e.start for e in flat]
    assert runs.lengths.tolist() == [e.length for e in flat]
    assert runs.total_rows == sum(e.length for e in flat)


@settings(max_examples=200, deadline=None)
@given(extent_lists.filter(bool), st.data())
def test_a_miscounted_copy_is_named(extents: list[list[Extent]], data: st.DataObject) -> None:
    copies = copies_of(extents)
    bad = data.draw(st.integers(0, len(copies) - 1))
    wrong = copies[bad].rows + data.draw(st.sampled_from([-1, 1, 7]))
    copies[bad] = PlannedCopy(copies[bad].ticket, copies[bad].key, copies[bad].extents, max(0, wrong))
    if copies[bad].rows == sum(e.length for e in copies[bad].extents):
        return
    with pytest.raises(LayoutMismatch, match=f"entry 'e{bad}' has {copies[bad].rows} rows"):
        plan_runs(copies, NUM_BLOCKS)


def test_a_copy_beyond_the_region_is_named() -> None:
    copies = copies_of([[Extent(0, 4)], [Extent(NUM_BLOCKS - 2, 3)]])
    with pytest.raises(LayoutMismatch, match="entry 'e1' has extents .* beyond the region's 4096 blocks"):
        plan_runs(copies, NUM_BLOCKS)


def test_an_empty_batch_plans_nothing() -> None:
    runs = plan_runs([], NUM_BLOCKS)
    assert runs.total_rows == 0 and len(runs.starts) == 0 and runs.rows == []
