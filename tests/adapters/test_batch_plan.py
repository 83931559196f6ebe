"""The CUDA engine's compiled batch plan (batchplan.c), executed on host memory.

Needs no GPU: each plan is carried out here the way the engine hands it to the device (the copy
engines' (dst, src, size) copies with memmove; the copy kernel's runs, inline or from the staged
table, row by row as kernels.py reads them), and every row must land where its copy's extents say,
nothing else touched. Needs a C compiler, as the engine does (skipped with the reason without one).
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ec_connector.adapters.torch_copy.native.batchplan import BatchPlan, BatchPlanner
from ec_connector.domain.blocks import Extent
from ec_connector.domain.errors import LayoutMismatch
from ec_connector.domain.transfers import PlannedCopy

from ..native_marks import NEEDS_PLANNER_BUILD

pytestmark = NEEDS_PLANNER_BUILD

NUM_BLOCKS = 512
ROW = 48  # bytes per block: words of 8 and 16-byte accesses both occur
FEW, MIXED, FEW_SAVE = 4, 16, 8


class Host:
    """A region and dense buffers in this process's memory, with their addresses."""

    def __init__(self, num_blocks: int = NUM_BLOCKS) -> None:
        self.num_blocks = num_blocks
        self.region = np.zeros(num_blocks * ROW, dtype=np.uint8)
        self.address = self.region.ctypes.data

    def planner(self, big_rows: int | None) -> BatchPlanner:
        return BatchPlanner(
            num_blocks=self.num_blocks,
            row_bytes=ROW,
            host_address=self.address,
            big_rows=big_rows,
            few_runs=FEW,
            few_runs_save=FEW_SAVE,
            mixed_min_runs=MIXED,
            base_align=ROW | self.address,
        )


def column(address: int, count: int) -> list[int]:
    return list((ctypes.c_int64 * count).from_address(address)) if count else []


def carry_out(plan: BatchPlan, host: Host, dense_base: int, *, save: bool) -> None:
    """Do what the engine makes the device do: the copy-engine copies, then the kernel's rows."""
    for dst, src, size in zip(
        column(plan.dma_dst, plan.dma),
        column(plan.dma_src, plan.dma),
        column(plan.dma_size, plan.dma),
        strict=True,
    ):
        ctypes.memmove(dst, src, size)
    if not plan.kernel:
        return
    assert plan.inline is None or plan.kernel <= 16
    row_words, word = ROW // plan.word, plan.word
    if plan.inline is not None:
        n = plan.kernel
        firsts = [0, *plan.inline[:15]][:n]
        starts = list(plan.inline[15:31])[:n]
        bases = list(plan.inline[31:47])[:n]  # dense word of each run's first row
        assert all(f == plan.kernel_rows for f in plan.inline[n - 1 : 15])  # padding past the last run
    else:
        table = column(plan.table, 3 * plan.kernel)
        firsts, starts, deltas = (
            table[: plan.kernel],
            table[plan.kernel : 2 * plan.kernel],
            table[2 * plan.kernel :],
        )
        if not plan.delta:
            assert not any(deltas)
        bases = [d + f * row_words for f, d in zip(firsts, deltas, strict=True)]
    ends = [*firsts[1:], plan.kernel_rows]
    for first, end, start, base in zip(firsts, ends, starts, bases, strict=True):
        for r in range(end - first):
            dense = dense_base + (base + r * row_words) * word
            block = host.address + (start + r) * ROW
            src, dst = (dense, block) if save else (block, dense)
            ctypes.memmove(dst, src, ROW)


# entries: (extents as (gap before, length) pairs); placed left to right in the region
entries = st.lists(
    st.lists(st.tuples(st.sampled_from([0, 0, 1, 3]), st.integers(1, 12)), min_size=1, max_size=5),
    min_size=1,
    max_size=24,
)


def place(shape: list[list[tuple[int, int]]]) -> list[PlannedCopy]:
    copies, block = [], 0
    for i, runs in enumerate(shape):
        ext = []
        for gap, length in runs:
            block += gap
            ext.append(Extent(block, length))
            block += length
        copies.append(PlannedCopy(i + 1, f"e{i}", tuple(ext), sum(e.length for e in ext)))
    return copies


def expected_rows(copies: list[PlannedCopy]) -> list[int]:
    """Region block of each batch row, copies back to back."""
    return [e.start + k for c in copies for e in c.extents for k in range(e.length)]


@settings(max_examples=300, deadline=None)
@given(entries, st.sampled_from([None, 1, 3, 8, 1000]), st.booleans(), st.data())
def test_a_planned_save_puts_every_row_in_its_block_and_nothing_else(
    shape: list[list[tuple[int, int]]], big_rows: int | None, one_output: bool, data: st.DataObject
) -> None:
    copies = place(shape)
    if max(e.end for c in copies for e in c.extents) > NUM_BLOCKS:
        return
    host = Host()
    rows = [c.rows for c in copies]
    rng = np.random.default_rng(len(rows))
    if one_output:  # the encoder's per-item outputs: views of one buffer, back to back (joinable)
        whole = rng.integers(1, 256, sum(rows) * ROW, dtype=np.uint8)
        cut = np.cumsum([0, *rows]) * ROW
        payloads = [whole[a:b] for a, b in zip(cut[:-1], cut[1:], strict=True)]
        offsets = [int(a) for a in cut[:-1]]
    else:  # separately allocated, each at its own byte offset into its storage (so the kernel's
        # word must fit every payload's address); never joined, even where two sit back to back
        offsets = [int(rng.choice([0, 2, 4, 8])) for _ in rows]
        buffers = [rng.integers(1, 256, r * ROW + 8, dtype=np.uint8) for r in rows]
        payloads = [b[o : o + r * ROW] for b, o, r in zip(buffers, offsets, rows, strict=True)]
    planner = host.planner(big_rows)  # its workspace holds the plan: keep it alive
    plan = planner.save(copies, [p.ctypes.data for p in payloads], offsets, 1)
    assert plan.total_rows == sum(rows)
    assert sum(column(plan.dma_size, plan.dma)) // ROW + plan.kernel_rows == plan.total_rows
    carry_out(plan, host, payloads[0].ctypes.data, save=True)
    want = np.zeros_like(host.region).reshape(NUM_BLOCKS, ROW)
    for block, row in zip(expected_rows(copies), np.concatenate(payloads).reshape(-1, ROW), strict=True):
        want[block] = row
    assert np.array_equal(host.region.reshape(NUM_BLOCKS, ROW), want)


@settings(max_examples=300, deadline=None)
@given(entries, st.sampled_from([None, 1, 3, 8, 1000]))
def test_a_planned_load_reads_every_row_from_its_block(
    shape: list[list[tuple[int, int]]], big_rows: int | None
) -> None:
    copies = place(shape)
    if max(e.end for c in copies for e in c.extents) > NUM_BLOCKS:
        return
    host = Host()
    host.region[:] = np.random.default_rng(7).integers(0, 256, host.region.size, dtype=np.uint8)
    out = np.zeros(sum(c.rows for c in copies) * ROW + 64, dtype=np.uint8)  # 64: overrun guard
    planner = host.planner(big_rows)  # its workspace holds the plan: keep it alive
    plan = planner.load(copies, out.ctypes.data)
    carry_out(plan, host, out.ctypes.data, save=False)
    want = host.region.reshape(NUM_BLOCKS, ROW)[expected_rows(copies)].reshape(-1)
    assert np.array_equal(out[: want.size], want)
    assert not out[want.size :].any()


def test_touching_runs_join_and_the_split_follows_the_copy_engine_rules() -> None:
    host = Host()
    planner = host.planner(big_rows=8)
    dense = 1 << 20  # loads: the rows land back to back from here (never touched in this test)
    # six runs, all touching on both sides: one run after joining, so one copy-engine copy
    touching = [PlannedCopy(i + 1, f"t{i}", (Extent(2 * i, 2),), 2) for i in range(6)]
    plan = planner.load(touching, dense)
    assert (plan.dma, plan.kernel) == (1, 0) and column(plan.dma_size, 1) == [12 * ROW]
    # at most FEW runs: all to the copy engines, however short
    few = [PlannedCopy(i + 1, f"f{i}", (Extent(3 * i, 1),), 1) for i in range(FEW)]
    plan = planner.load(few, dense)
    assert (plan.dma, plan.kernel) == (FEW, 0)
    # a long run among at most MIXED runs: all to the copy engines
    mixed = [PlannedCopy(1, "long", (Extent(0, 8),), 8)] + [
        PlannedCopy(i + 2, f"m{i}", (Extent(10 + 2 * i, 1),), 1) for i in range(MIXED - 1)
    ]
    plan = planner.load(mixed, dense)
    assert (plan.dma, plan.kernel) == (MIXED, 0)
    # with one more short run: the long one to the copy engines, the rest to the kernel, renumbered
    more = mixed + [PlannedCopy(99, "m-last", (Extent(100, 1),), 1)]
    plan = planner.load(more, dense)
    assert (plan.dma, plan.kernel, plan.kernel_rows) == (1, MIXED, MIXED)
    assert plan.inline is not None and plan.inline[: MIXED - 1] == tuple(range(1, MIXED))
    assert column(plan.dma_size, 1) == [8 * ROW]
    # seventeen short runs: the staged table, whose delta column is zero for a load
    plan = planner.load([PlannedCopy(i + 1, f"k{i}", (Extent(2 * i, 1),), 1) for i in range(17)], dense)
    assert plan.inline is None and plan.kernel == 17 and not plan.delta


def short_runs_planner(host: Host, *, few_short: int = 0, short_per_copy: int = 0) -> BatchPlanner:
    return BatchPlanner(
        num_blocks=host.num_blocks,
        row_bytes=ROW,
        host_address=host.address,
        big_rows=8,
        few_runs=FEW,
        mixed_min_runs=MIXED,
        base_align=ROW | host.address,
        few_short=few_short,
        short_per_copy=short_per_copy,
    )


def save_plan(planner: BatchPlanner, batch: list[PlannedCopy]) -> BatchPlan:
    """`planner.save` of payloads back to back in one buffer."""
    rows = [c.rows for c in batch]
    payloads = np.zeros(sum(rows) * ROW, dtype=np.uint8)
    pointers = [payloads.ctypes.data + ROW * sum(rows[:i]) for i in range(len(batch))]
    return planner.save(batch, pointers, [0] * len(batch), 1)


def test_a_few_short_runs_beside_long_ones_go_to_the_copy_engines_when_asked() -> None:
    host = Host()
    dense = 1 << 20
    # 17 long runs (more than MIXED) and 3 short ones, apart from one another
    batch = [PlannedCopy(i + 1, f"l{i}", (Extent(10 * i, 8),), 8) for i in range(17)] + [
        PlannedCopy(100 + i, f"s{i}", (Extent(200 + 3 * i, 1),), 1) for i in range(3)
    ]
    split = host.planner(big_rows=8).load(batch, dense)
    assert (split.dma, split.kernel) == (17, 3)  # the default: short runs to the kernel
    planner = short_runs_planner(host, few_short=3)
    plan = planner.load(batch, dense)
    assert (plan.dma, plan.kernel) == (20, 0)  # 3 short runs: all to the copy engines
    assert column(plan.dma_size, 20)[-3:] == [ROW] * 3
    assert (save_plan(planner, batch).dma, save_plan(planner, batch).kernel) == (20, 0)
    more = batch + [PlannedCopy(99, "s-last", (Extent(300, 1),), 1)]
    assert (planner.load(more, dense).dma, planner.load(more, dense).kernel) == (17, 4)
    assert (save_plan(planner, more).dma, save_plan(planner, more).kernel) == (17, 4)


def test_one_short_run_per_entry_beside_long_ones_goes_to_the_copy_engines_when_asked() -> None:
    """What the run floor leaves: entries split into a long piece and a short last one."""
    host = Host()
    dense = 1 << 20
    batch = [PlannedCopy(i + 1, f"e{i}", (Extent(12 * i, 8), Extent(12 * i + 10, 1)), 9) for i in range(20)]
    planner = short_runs_planner(host, few_short=3, short_per_copy=1)
    plan = planner.load(batch, dense)
    assert (plan.dma, plan.kernel) == (40, 0)  # 20 short runs for 20 entries
    assert column(plan.dma_size, 40)[:2] == [8 * ROW, ROW]
    assert (save_plan(planner, batch).dma, save_plan(planner, batch).kernel) == (40, 0)
    # one entry in three runs: 21 short ones for 20 entries, so the short ones go to the kernel
    odd = [*batch[:-1], PlannedCopy(99, "odd", (Extent(300, 8), Extent(310, 1), Extent(312, 1)), 10)]
    assert (planner.load(odd, dense).dma, planner.load(odd, dense).kernel) == (20, 21)
    assert (save_plan(planner, odd).dma, save_plan(planner, odd).kernel) == (20, 21)
    # without the per-entry allowance, 20 short runs are more than few_short
    assert short_runs_planner(host, few_short=3).load(batch, dense).kernel == 20


def test_saves_send_more_runs_wholly_to_the_copy_engines_than_loads() -> None:
    host = Host()
    planner = host.planner(big_rows=8)
    copies = [PlannedCopy(i + 1, f"s{i}", (Extent(3 * i, 1),), 1) for i in range(FEW_SAVE)]
    payload = np.zeros(FEW_SAVE * ROW, dtype=np.uint8)
    pointers = [payload.ctypes.data + i * ROW for i in range(FEW_SAVE)]
    plan = planner.save(copies, pointers, [i * ROW for i in range(FEW_SAVE)], 1)
    assert (plan.dma, plan.kernel) == (FEW_SAVE, 0)
    load = planner.load(copies, 1 << 20)
    assert (load.dma, load.kernel) == (0, FEW_SAVE)
    more = [*copies, PlannedCopy(99, "s-last", (Extent(3 * FEW_SAVE, 1),), 1)]
    pointers.append(payload.ctypes.data)  # never written: the plan only reads the addresses
    plan = planner.save(more, pointers, [*range(0, FEW_SAVE * ROW, ROW), 0], 1)
    assert (plan.dma, plan.kernel) == (0, FEW_SAVE + 1)


def test_separate_payloads_are_not_joined_even_when_their_bytes_touch() -> None:
    host = Host()
    planner = host.planner(big_rows=None)
    buf = np.zeros(10 * ROW, dtype=np.uint8)
    copies = [PlannedCopy(i + 1, f"p{i}", (Extent(2 * i, 2),), 2) for i in range(5)]
    pointers = [buf.ctypes.data + 2 * i * ROW for i in range(5)]
    shared = planner.save(copies, pointers, [2 * i * ROW for i in range(5)], 1)  # views of `buf`
    assert shared.kernel == 1
    apart = planner.save(copies, pointers, [0] * 5, 1)  # five allocations that happen to touch
    assert apart.kernel == 5


def test_a_miscounted_copy_and_one_beyond_the_region_are_named() -> None:
    planner = Host().planner(big_rows=None)
    good = PlannedCopy(1, "good", (Extent(0, 4),), 4)
    miscounted = PlannedCopy(2, "short", (Extent(10, 4),), 5)
    with pytest.raises(LayoutMismatch, match="entry 'short' has 5 rows but its extents cover 4 blocks"):
        planner.load([good, miscounted], 1 << 20)
    beyond = PlannedCopy(3, "far", (Extent(NUM_BLOCKS - 2, 3),), 3)
    with pytest.raises(LayoutMismatch, match=f"entry 'far' has extents .* beyond the region's {NUM_BLOCKS}"):
        planner.save([good, beyond], [1 << 20, 1 << 21], [0, 0], 1)


def test_a_packed_form_that_disagrees_with_the_extents_is_refused() -> None:
    planner = Host().planner(big_rows=None)
    lying = PlannedCopy(1, "liar", (Extent(0, 4),), 4, packed=np.array([-5, 4], np.int64).tobytes())
    with pytest.raises(LayoutMismatch, match="packed extents do not match"):
        planner.load([lying], 1 << 20)


def test_batches_larger_than_the_workspace_grow_it() -> None:
    planner = Host(num_blocks=8192).planner(big_rows=None)
    copies = [PlannedCopy(1, "many", tuple(Extent(2 * i, 1) for i in range(3000)), 3000)]
    plan = planner.load(copies, 1 << 20)
    assert plan.kernel == 3000 and plan.kernel_rows == 3000
    assert planner.load(copies[:0], 1 << 20).total_rows == 0
    # more copies than the planner has room for, each of several runs
    many = [PlannedCopy(i + 1, f"k{i}", (Extent(6 * i, 2), Extent(6 * i + 3, 2)), 4) for i in range(300)]
    plan = planner.load(many, 1 << 20)
    assert (plan.total_rows, plan.kernel) == (1200, 600)
    assert planner.load(many[:2], 1 << 20).kernel == 4, "a small batch after the growth"


def test_values_of_the_wrong_kind_are_named_and_nothing_is_planned() -> None:
    """The C reads the copies themselves: what is not a copy's packed extents, rows or a save's
    per-copy pointer raises a TypeError naming it (through ctypes, with the GIL held)."""
    planner = Host().planner(big_rows=None)
    good = PlannedCopy(1, "good", (Extent(0, 4),), 4)
    with pytest.raises(TypeError, match="copy 1's packed extents are not int64"):
        planner.load([good, SimpleNamespace(packed=[0, 4], rows=4)], 1 << 20)
    with pytest.raises(TypeError, match="copy 0's packed extents are not int64"):
        planner.load([SimpleNamespace(packed=b"\0" * 15, rows=4)], 1 << 20)
    with pytest.raises(TypeError):
        planner.load([SimpleNamespace(packed=good.packed, rows="4")], 1 << 20)
    with pytest.raises(AttributeError):
        planner.load([SimpleNamespace(rows=4)], 1 << 20)
    with pytest.raises(TypeError, match="must be a list or a tuple"):
        planner.load(good, 1 << 20)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pointers and offsets must be lists of 1 ints, one per copy"):
        planner.save([good], [1 << 20, 1 << 21], [0, 0], 1)
    with pytest.raises(TypeError, match="copy 0's payload pointer and offset must be ints"):
        planner.save([good], ["far"], [0], 1)  # type: ignore[list-item]
    assert planner.load(iter([good]), 1 << 20).total_rows == 4, "any iterable of copies is taken"  # type: ignore[arg-type]
    assert planner.load([good], 1 << 20).total_rows == 4, "the planner still plans after each"


def test_the_access_width_rule_is_the_one_each_plan_applies() -> None:
    """What the engine compiles its kernel variants for ahead of time is what plans pick."""
    host = Host()
    planner = host.planner(big_rows=None)
    assert [planner.access(a) for a in (16, 48, 8, 4, 2, 1, 0, 1 << 20)] == [
        (8, 2),
        (8, 2),
        (8, 1),
        (4, 1),
        (2, 1),
        (1, 1),
        (8, 2),
        (8, 2),
    ]
    copies = [PlannedCopy(i + 1, f"k{i}", (Extent(3 * i, 1),), 1) for i in range(20)]
    for dense in (1 << 20, (1 << 20) + 8, (1 << 20) + 2):
        plan = planner.load(copies, dense)
        assert (plan.word, plan.vec) == planner.access(ROW | host.address | dense)
