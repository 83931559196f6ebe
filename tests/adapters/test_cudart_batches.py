"""`CudaRuntime.memcpy_batch` cuts long batches into driver calls of at most `BATCH_MAX` copies.

The driver entry point is replaced by a recorder here (no GPU on CI); the real call runs in the CUDA
contract suites on the GPU machine. What is checked is our side: every copy handed to the driver
exactly once, in order, each call's three columns pointing at the same copies.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from ec_connector.adapters.torch_copy import cudart
from ec_connector.adapters.torch_copy.cudart import BATCH_MAX, CudaRuntime

# one driver call: its destinations, sources and sizes, its stream and its attributes' address
Call = tuple[list[int], list[int], list[int], int, int]
IN_ORDER, SETTLED = 0x1000, 0x2000  # stand-ins for the two attribute structs' addresses


def recording_runtime(fail_index: bool) -> tuple[CudaRuntime, list[Call]]:
    calls: list[Call] = []

    def batch(dsts: int, srcs: int, sizes: int, count: int, *rest: int) -> int:
        stream = rest[-1]
        assert len(rest) == (5 if fail_index else 4)  # attrs, attr indices, number of attrs, [fail], stream
        column = [list((ctypes.c_int64 * count).from_address(a)) for a in (dsts, srcs, sizes)]
        calls.append((*column, stream, rest[0]))  # type: ignore[arg-type]
        return cudart.SUCCESS

    rt = CudaRuntime.__new__(CudaRuntime)
    rt._batch = batch  # type: ignore[assignment]
    rt._batch_has_fail_index = fail_index
    rt._attr_index_address = rt._fail_index_address = 0
    rt._attrs_address, rt._settled_attrs_address = IN_ORDER, SETTLED
    return rt, calls


@pytest.mark.parametrize("count", [2, BATCH_MAX - 1, BATCH_MAX, BATCH_MAX + 1, 3 * BATCH_MAX + 7])
@pytest.mark.parametrize("fail_index", [False, True])
def test_every_copy_reaches_the_driver_once_in_order_in_calls_of_at_most_batch_max(
    count: int, fail_index: bool
) -> None:
    rt, calls = recording_runtime(fail_index)
    dsts = np.arange(count, dtype=np.int64) * 16 + (1 << 40)
    srcs = np.arange(count, dtype=np.int64) * 16 + (1 << 41)
    sizes = np.arange(count, dtype=np.int64) + 1
    rt.memcpy_many(dsts, srcs, sizes, 77)
    assert len(calls) == -(-count // BATCH_MAX)
    assert all(len(d) <= BATCH_MAX and stream == 77 for d, _, _, stream, _ in calls)
    for column, want in enumerate((dsts, srcs, sizes)):
        assert sum((call[column] for call in calls), []) == want.tolist()


@pytest.mark.parametrize("settled", [False, True])
def test_settled_sources_are_read_out_of_stream_order_in_every_call(settled: bool) -> None:
    rt, calls = recording_runtime(fail_index=False)
    count = 2 * BATCH_MAX + 1
    sizes = np.ones(count, dtype=np.int64)
    at = sizes.ctypes.data
    rt.memcpy_batch(at, at, at, count, 77, source_settled=settled)
    assert [attrs for *_, attrs in calls] == [SETTLED if settled else IN_ORDER] * 3
