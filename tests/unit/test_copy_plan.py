"""The copier's batch plan (adapters/torch_copy/plan.py) against a plain-Python reference."""

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
    firsts, row = [], 0
    for e in flat:
        firsts.append(row)
        row += e.length
    assert runs.tickets == [c.ticket for c in copies]
    assert runs.rows == [c.rows for c in copies]
    assert runs.counts.tolist() == [len(ext) for ext in extents]
    assert runs.starts.tolist() == [e.start for e in flat]
    assert runs.lengths.tolist() == [e.length for e in flat]
    assert runs.firsts.tolist() == firsts
    assert runs.total_rows == row
    assert runs.one_run_each == all(len(ext) == 1 for ext in extents)
    entry_firsts, row = [], 0
    for c in copies:
        entry_firsts.append(row)
        row += c.rows
    assert runs.entry_firsts().tolist() == entry_firsts
    per_run = runs.per_run(runs.entry_firsts()).tolist()
    assert per_run == [f for f, ext in zip(entry_firsts, extents, strict=True) for _ in ext]


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


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 8), st.booleans(), st.booleans()), min_size=1, max_size=30),
)
def test_joining_touching_runs_keeps_every_row_where_it_was(shape: list[tuple[int, bool, bool]]) -> None:
    """Runs are joined only where both sides continue; the row -> (block, address) map is unchanged."""
    np = pytest.importorskip("numpy")
    from ec_connector.adapters.torch_copy.cuda import _join_touching

    row_bytes = 64
    starts, lengths, at, block, address = [], [], [], 100, 1 << 20
    for n, region_gap, dense_gap in shape:
        block += 2 if region_gap else 0
        address += 3 * row_bytes if dense_gap else 0
        starts.append(block)
        lengths.append(n)
        at.append(address)
        block += n
        address += n * row_bytes
    arr = lambda v: np.array(v, dtype=np.int64)  # noqa: E731
    firsts = np.cumsum(arr(lengths)) - arr(lengths)
    j_starts, j_lengths, j_firsts, j_at = _join_touching(
        arr(starts), arr(lengths), firsts, arr(at), row_bytes
    )

    def rows(s, ln, f, a):  # noqa: ANN001, ANN202
        return {
            int(f[i]) + r: (int(s[i]) + r, int(a[i]) + r * row_bytes)
            for i in range(len(s))
            for r in range(int(ln[i]))
        }

    assert rows(j_starts, j_lengths, j_firsts, j_at) == rows(arr(starts), arr(lengths), firsts, arr(at))
    joins = sum(1 for _n, rg, dg in shape[1:] if not rg and not dg)
    assert len(j_starts) == len(shape) - joins


@pytest.mark.parametrize("shared", [True, False])
def test_runs_of_different_payloads_join_only_inside_one_allocation(shared: bool) -> None:
    np = pytest.importorskip("numpy")
    from ec_connector.adapters.torch_copy.cuda import _join_touching

    class Owners:  # payload 0 holds runs 0-1, payload 1 runs 2-3; all four touch on both sides
        of_run = np.array([0, 0, 1, 1], dtype=np.int64)

        def storage_bases(self) -> np.ndarray:
            return np.array([1000, 1000 if shared else 1005], dtype=np.int64)

    arr = lambda v: np.array(v, dtype=np.int64)  # noqa: E731
    starts, lengths, firsts, at = (
        arr([10, 12, 15, 16]),
        arr([2, 3, 1, 4]),
        arr([0, 2, 5, 6]),
        arr([0, 2, 5, 6]),
    )
    j_starts, j_lengths, _, j_at = _join_touching(starts, lengths, firsts, at, 1, Owners())  # type: ignore[arg-type]
    if shared:
        assert j_starts.tolist() == [10] and j_lengths.tolist() == [10]
    else:
        assert j_starts.tolist() == [10, 15] and j_lengths.tolist() == [5, 5] and j_at.tolist() == [0, 5]
