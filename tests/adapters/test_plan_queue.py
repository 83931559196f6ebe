"""One native call plans a copy-engine batch and queues it (batchplan.c's ec_plan_queue, queue.h).

The CUDA engine hands loads, and saves the step thread makes itself, to `BatchPlanner.load_queued`
and `save_queued`: a batch that goes wholly to the copy engines is queued in the same C call as its
plan. Here the CUDA entry points are our own loggers (fake_runtime.py), so the stream operations,
their order, the copies handed over (those the plan alone gives), the attributes and the failures
are checked without a GPU; the CUDA suites run the same call against the real runtime.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import numpy as np
import pytest

from ec_connector.adapters.torch_copy.native.batchplan import BatchPlan, BatchPlanner, Queue, QueueFailed
from ec_connector.domain.blocks import Extent
from ec_connector.domain.errors import LayoutMismatch
from ec_connector.domain.transfers import PlannedCopy

from ..native_marks import NEEDS_PLANNER_BUILD
from .fake_runtime import ATTRS, SETTLED_ATTRS, Runtime

pytestmark = NEEDS_PLANNER_BUILD

ROW, BLOCKS, HOST = 4096, 4096, 1 << 32
CALLER, STREAM, FENCE, START, END = 0xC0, 0x5E, 0xFE, 0x57, 0xE0
QUEUE = Queue(CALLER, STREAM, FENCE, START, END)
DENSE = 1 << 40


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    yield Runtime(batch_max=4)


def planner(runtime: Runtime | None) -> BatchPlanner:
    table = None if runtime is None else runtime.driver_table()
    return BatchPlanner(
        num_blocks=BLOCKS,
        row_bytes=ROW,
        host_address=HOST,
        big_rows=64,  # runs of 256 KiB and more go to the copy engines
        few_runs=4,
        mixed_min_runs=16,
        base_align=ROW | HOST,
        driver=None if table is None else (int(table.ctypes.data), SETTLED_ATTRS, ATTRS),
    )


def batch(*shapes: tuple[tuple[int, int], ...]) -> list[PlannedCopy]:
    return [
        PlannedCopy(i + 1, f"k{i}", tuple(Extent(s, n) for s, n in runs), sum(n for _, n in runs))
        for i, runs in enumerate(shapes)
    ]


def copies_of(plan: BatchPlan) -> list[tuple[int, int, int]]:
    """The plan's copy-engine copies (read while its planner lives: they are in its workspace)."""
    columns = [
        list((ctypes.c_int64 * plan.dma).from_address(a)) for a in (plan.dma_dst, plan.dma_src, plan.dma_size)
    ]
    return list(zip(*columns, strict=True))


LONG = batch(((0, 64),), ((100, 80), (300, 70)), ((500, 64),), ((700, 100),), ((900, 64), (1100, 65)))


def test_a_load_is_planned_queued_and_joined_to_the_callers_stream_in_one_call(runtime: Runtime) -> None:
    alone = planner(None)
    expected = copies_of(alone.load(LONG, DENSE))
    assert len(expected) == 7

    assert planner(runtime).load_queued(LONG, DENSE, QUEUE) is None
    batches = [call[2] for call in runtime.calls if call[0] == "batch"]
    assert (
        runtime.calls
        == [
            ("record", FENCE, CALLER),  # the fence on the caller's stream
            ("wait", STREAM, FENCE),
            ("record", START, STREAM),
            ("batch", STREAM, expected[:4]),  # calls of at most batch_max copies, in order
            ("batch", STREAM, expected[4:]),
            ("record", END, STREAM),
            ("wait", CALLER, END),  # what the caller queues next sees the bytes
        ]
    )
    assert [c for b in batches for c in b] == expected
    assert runtime.attrs == [SETTLED_ATTRS, SETTLED_ATTRS], "a load's sources may be read out of stream order"


def test_a_load_onto_the_callers_own_stream_needs_no_fence_and_no_join(runtime: Runtime) -> None:
    alone = planner(None)
    expected = copies_of(alone.load(LONG, DENSE))
    own = Queue(CALLER, CALLER, FENCE, START, END)  # the caller's stream is the copies' stream
    assert planner(runtime).load_queued(LONG, DENSE, own) is None
    assert runtime.calls == [
        ("record", START, CALLER),
        ("batch", CALLER, expected[:4]),
        ("batch", CALLER, expected[4:]),
        ("record", END, CALLER),
    ]


def test_a_save_is_queued_in_stream_order_and_the_caller_does_not_wait(runtime: Runtime) -> None:
    payloads = [np.zeros(c.rows * ROW, dtype=np.uint8) for c in LONG[:2]]
    pointers, offsets = [int(p.ctypes.data) for p in payloads], [0, 0]
    alone = planner(None)
    expected = copies_of(alone.save(LONG[:2], pointers, offsets, 1))

    assert planner(runtime).save_queued(LONG[:2], pointers, offsets, 1, QUEUE) is None
    assert runtime.calls == [
        ("record", FENCE, CALLER),
        ("wait", STREAM, FENCE),
        ("record", START, STREAM),
        ("batch", STREAM, expected),
        ("record", END, STREAM),
    ]
    assert runtime.attrs == [ATTRS], "a save reads its payloads in stream order"


def test_each_call_queues_on_its_own_streams_and_events(runtime: Runtime) -> None:
    """The queue's streams and events are the planner's per-call slots: the second batch must not
    reuse the first one's."""
    one = batch(((0, 64),))
    planned = planner(runtime)
    second = Queue(0xC1, 0x5F, FENCE, 0x58, 0xE1)
    assert planned.load_queued(one, DENSE, QUEUE) is None
    assert planned.load_queued(one, DENSE, second) is None
    copy = [(DENSE, HOST, 64 * ROW)]
    assert runtime.calls == [
        ("record", FENCE, CALLER),
        ("wait", STREAM, FENCE),
        ("record", START, STREAM),
        ("memcpy", STREAM, copy),
        ("record", END, STREAM),
        ("wait", CALLER, END),
        ("record", FENCE, 0xC1),
        ("wait", 0x5F, FENCE),
        ("record", 0x58, 0x5F),
        ("memcpy", 0x5F, copy),
        ("record", 0xE1, 0x5F),
        ("wait", 0xC1, 0xE1),
    ]


def test_a_single_copy_goes_through_cudamemcpyasync(runtime: Runtime) -> None:
    one = batch(((0, 64),))
    assert planner(runtime).load_queued(one, DENSE, QUEUE) is None
    assert runtime.calls[3] == ("memcpy", STREAM, [(DENSE, HOST, 64 * ROW)])


def test_a_batch_with_kernel_runs_is_only_planned(runtime: Runtime) -> None:
    short = batch(*[((10 * i, 2),) for i in range(0, 400, 2)])  # 200 runs of 8 KiB: the kernel's
    plan = planner(runtime).load_queued(short, DENSE, QUEUE)
    assert plan is not None and plan.kernel > 0
    assert runtime.calls == [], "the kernel is launched from Python, around its own stream operations"


@pytest.mark.parametrize(
    ("failing", "named", "made"),
    [
        (("record", 0), r"cudaEventRecord \(the fence, on the caller's stream\)", 1),
        (("wait", 0), r"cudaStreamWaitEvent \(the fence\)", 2),
        (("batch", 1), "the copies", 5),
        (("record", 2), r"cudaEventRecord \(end\)", 6),
        (("wait", 1), r"cudaStreamWaitEvent \(the caller's stream on the end event\)", 7),
    ],
)
def test_a_failing_call_is_named_and_no_later_call_is_made(
    runtime: Runtime, failing: tuple[str, int], named: str, made: int
) -> None:
    runtime.fail[failing] = 700
    with pytest.raises(QueueFailed, match=f"{named} failed with CUDA error 700") as failed:
        planner(runtime).load_queued(LONG, DENSE, QUEUE)
    assert failed.value.code == 700
    assert len(runtime.calls) == made


def test_a_bad_batch_is_refused_before_any_call(runtime: Runtime) -> None:
    beyond = batch(((0, 64),), ((BLOCKS - 10, 64),))
    with pytest.raises(LayoutMismatch, match="k1"):
        planner(runtime).load_queued(beyond, DENSE, QUEUE)
    assert runtime.calls == []


def test_a_planner_without_a_driver_table_refuses_to_queue() -> None:
    with pytest.raises(ValueError, match="without a driver table"):
        planner(None).load_queued(LONG, DENSE, QUEUE)
