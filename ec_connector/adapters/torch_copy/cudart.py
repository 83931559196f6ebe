"""The CUDA runtime that torch loaded, called through ctypes, for the few calls on the launch path.

Why not torch's wrappers: on the GPU machine each `torch.cuda.Event.record`, `Stream.wait_event`,
`copy_` or `set_stream` costs several µs of Python, and a batch needs about ten of them; a ctypes
call costs well under one. The launch path's calls, which only queue work and never wait, keep the
GIL (bound through `ctypes.PyDLL`): releasing and taking it back around each cost more than the
call, and let another thread (the tier watcher, vLLM's) in between the calls of one launch.
Calls that may wait (`cudaEventSynchronize`, registration) release it.

Why not cuda-bindings: it is an extra dependency, and it must be the very library torch uses (same
process state), which is found in /proc/self/maps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ec_connector.domain.errors import ECConnectorError

SUCCESS = 0
NOT_READY = 600
ALREADY_REGISTERED = 712
_MEMCPY_DEFAULT = 4
_EVENT_DISABLE_TIMING = 0x2
_SRC_ACCESS_ORDER_STREAM = 0x1
# cudaMemcpySrcAccessOrderAny: the driver may read the source out of stream order, during or after
# the call. Valid only for sources that no earlier work is writing and that stay unchanged until the
# copy ends: the region's blocks of a planned load (see `memcpy_batch`). On the H200 a
# host-to-device batch with short copies behind long ones cost less host time with it (32 x 8 MiB
# with 3 short copies each: 299 against 460 µs in the same run), device time unchanged.
_SRC_ACCESS_ORDER_ANY = 0x3
# cudaMemcpyFlagPreferOverlapWithCompute: a hint only (order and bytes unchanged). On the H200 the
# same batches timed 1-15% less with it in a raw probe, and the copier's ratios to memcpy rose
# 1-3% (geometric mean over 48 cases, two A/B runs; docs/benchmarks.md).
_PREFER_OVERLAP_WITH_COMPUTE = 0x1
# Copies per cudaMemcpyBatchAsync call; longer batches are cut into calls of at most this many, in
# order. Driver 580.159 (CUDA 13, H200) segfaulted inside one call of ~8,700 short host-to-device
# copies out of a registered region (32 x 8 MiB of 2 KiB rows, runs of 8-16 rows to the copy
# engines), with or without the hint above; cut into calls of 256 the same batch ran and its bytes
# checked out. 32,000 small copies out of torch-pinned memory in one call did not crash.
BATCH_MAX = 256

_vp, _sz, _uint, _int = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _MemcpyAttributes(ctypes.Structure):
    _fields_ = [
        ("srcAccessOrder", ctypes.c_int),
        ("srcLocHint", _MemLocation),
        ("dstLocHint", _MemLocation),
        ("flags", ctypes.c_uint),
    ]


@dataclass(frozen=True)
class EntryPoints:
    """C function addresses (cudaSetDevice, cudaStreamWaitEvent, cudaEventRecord, cudaMemcpyAsync,
    cudaMemcpyBatchAsync), and what a batch call takes besides its columns."""

    set_device: int
    wait: int
    record: int
    memcpy: int
    batch: int
    batch_has_fail_index: bool
    attrs: int
    attr_index: int
    batch_max: int


class CudaRuntime:
    """Thin, checked wrappers; handles are plain ints (cudaEvent_t, cudaStream_t, addresses)."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.path = path
        self._lib = lib
        held = ctypes.PyDLL(path)  # the same library; its functions keep the GIL
        sig = {
            "cudaHostRegister": [_vp, _sz, _uint],
            "cudaHostUnregister": [_vp],
            "cudaHostGetDevicePointer": [ctypes.POINTER(_vp), _vp, _uint],
            "cudaGetErrorString": [_int],
            "cudaGetLastError": [],
            "cudaRuntimeGetVersion": [ctypes.POINTER(_int)],
            "cudaEventCreateWithFlags": [ctypes.POINTER(_vp), _uint],
            "cudaEventDestroy": [_vp],
            "cudaEventRecord": [_vp, _vp],
            "cudaEventQuery": [_vp],
            "cudaEventSynchronize": [_vp],
            "cudaEventElapsedTime": [ctypes.POINTER(ctypes.c_float), _vp, _vp],
            "cudaStreamWaitEvent": [_vp, _vp, _uint],
            "cudaMemcpyAsync": [_vp, _vp, _sz, _int, _vp],
            "cudaSetDevice": [_int],
        }
        queue_only = ("cudaEventRecord", "cudaEventQuery", "cudaStreamWaitEvent", "cudaMemcpyAsync")
        for name, args in sig.items():
            for source in (lib, held) if name in queue_only else (lib,):
                fn = getattr(source, name)
                fn.argtypes = args
                fn.restype = ctypes.c_char_p if name == "cudaGetErrorString" else _int
        version = _int()
        lib.cudaRuntimeGetVersion(ctypes.byref(version))
        self.version = version.value
        self._batch = None
        self._driver_table: np.ndarray | None = None
        if self.version >= 12080 and hasattr(lib, "cudaMemcpyBatchAsync"):
            batch = held.cudaMemcpyBatchAsync
            fail = [] if self.version >= 13000 else [_vp]  # CUDA 13 dropped the failIdx argument
            batch.argtypes = [_vp, _vp, _vp, _sz, _vp, _vp, _sz, *fail, _vp]
            batch.restype = _int
            self._batch = batch
            self._batch_has_fail_index = bool(fail)
            self._attrs = _MemcpyAttributes(_SRC_ACCESS_ORDER_STREAM, flags=_PREFER_OVERLAP_WITH_COMPUTE)
            self._settled_attrs = _MemcpyAttributes(_SRC_ACCESS_ORDER_ANY, flags=_PREFER_OVERLAP_WITH_COMPUTE)
            self._attr_index = (ctypes.c_size_t * 1)(0)
            self._fail_index = ctypes.c_size_t(0)
            self._attrs_address = ctypes.addressof(self._attrs)
            self._settled_attrs_address = ctypes.addressof(self._settled_attrs)
            self._attr_index_address = ctypes.addressof(self._attr_index)
            self._fail_index_address = ctypes.addressof(self._fail_index)
        # hot-path entry points, bound once, GIL kept
        self.record_raw = held.cudaEventRecord
        self.wait_raw = held.cudaStreamWaitEvent
        self.query_raw = held.cudaEventQuery
        self.memcpy_raw = held.cudaMemcpyAsync

    @property
    def has_batch_copy(self) -> bool:
        return self._batch is not None

    def entry_points(self) -> EntryPoints:
        """The addresses native code (launcher.c) calls to queue a save's stream operations and
        copies, with the stream-ordered batch attributes (requires `has_batch_copy`)."""
        if self._batch is None:
            raise ECConnectorError(f"{self.path} has no cudaMemcpyBatchAsync (CUDA {self.version})")
        wait, record, memcpy, batch, has_fail_index, batch_max, attr_index = self.driver_table().tolist()
        return EntryPoints(
            set_device=_function_address(self._lib.cudaSetDevice),
            wait=wait,
            record=record,
            memcpy=memcpy,
            batch=batch,
            batch_has_fail_index=bool(has_fail_index),
            attrs=self._attrs_address,
            attr_index=attr_index,
            batch_max=batch_max,
        )

    def driver_table(self) -> np.ndarray:
        """queue.h's `ec_driver_t` (int64 values: cudaStreamWaitEvent, cudaEventRecord,
        cudaMemcpyAsync, cudaMemcpyBatchAsync or 0, whether it takes a failIdx, the copies per call,
        the attribute index), for native code that queues a batch; kept alive here."""
        if self._driver_table is None:
            batch = self._batch
            self._driver_table = np.array(
                [
                    _function_address(self._lib.cudaStreamWaitEvent),
                    _function_address(self._lib.cudaEventRecord),
                    _function_address(self._lib.cudaMemcpyAsync),
                    0 if batch is None else _function_address(batch),
                    int(batch is not None and self._batch_has_fail_index),
                    BATCH_MAX,
                    0 if batch is None else self._attr_index_address,
                ],
                dtype=np.int64,
            )
        return self._driver_table

    def batch_attrs(self, *, source_settled: bool) -> int:
        """Address of the batch attributes `memcpy_batch` uses (see there); 0 without batch copies."""
        if self._batch is None:
            return 0
        return self._settled_attrs_address if source_settled else self._attrs_address

    def describe(self, err: int) -> str:
        text = self._lib.cudaGetErrorString(err)
        return f"CUDA error {err} ({text.decode() if text else '?'})"

    def check(self, err: int, what: str) -> None:
        if err:
            self._lib.cudaGetLastError()
            raise ECConnectorError(f"{what} failed: {self.describe(err)}; the GPU context may be unusable")

    def clear_error(self) -> None:
        self._lib.cudaGetLastError()

    # -- registration -----------------------------------------------------------------------------

    def host_register(self, address: int, nbytes: int, flags: int) -> int:
        return int(self._lib.cudaHostRegister(address, nbytes, flags))

    def host_unregister(self, address: int) -> int:
        return int(self._lib.cudaHostUnregister(address))

    def host_device_pointer(self, address: int) -> tuple[int, int]:
        out = _vp()
        err = int(self._lib.cudaHostGetDevicePointer(ctypes.byref(out), address, 0))
        return err, int(out.value or 0)

    # -- events and streams -----------------------------------------------------------------------

    def event(self, *, timing: bool) -> int:
        out = _vp()
        err = self._lib.cudaEventCreateWithFlags(ctypes.byref(out), 0 if timing else _EVENT_DISABLE_TIMING)
        self.check(err, "cudaEventCreateWithFlags")
        return int(out.value or 0)

    def destroy(self, event: int) -> None:
        self._lib.cudaEventDestroy(event)

    def record(self, event: int, stream: int) -> None:
        err = self.record_raw(event, stream)
        if err:
            self.check(err, "cudaEventRecord")

    def wait(self, stream: int, event: int) -> None:
        err = self.wait_raw(stream, event, 0)
        if err:
            self.check(err, "cudaStreamWaitEvent")

    def done(self, event: int) -> bool:
        """Non-blocking: has the event fired? (clears the not-ready status torch would trip on)"""
        err = self.query_raw(event)
        if err == SUCCESS:
            return True
        if err == NOT_READY:
            self._lib.cudaGetLastError()
            return False
        self.check(err, "cudaEventQuery")
        return False

    def synchronize(self, event: int) -> None:
        self.check(self._lib.cudaEventSynchronize(event), "cudaEventSynchronize")

    def elapsed(self, start: int, end: int) -> float:
        ms = ctypes.c_float()
        self.check(self._lib.cudaEventElapsedTime(ctypes.byref(ms), start, end), "cudaEventElapsedTime")
        return ms.value / 1e3

    # -- copies -----------------------------------------------------------------------------------

    def memcpy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        err = self.memcpy_raw(dst, src, nbytes, _MEMCPY_DEFAULT, stream)
        if err:
            self.check(err, "cudaMemcpyAsync")

    def memcpy_many(self, dsts: np.ndarray, srcs: np.ndarray, sizes: np.ndarray, stream: int) -> None:
        """`memcpy_batch` of three contiguous int64 arrays (addresses and byte counts)."""
        self.memcpy_batch(_address(dsts), _address(srcs), _address(sizes), len(sizes), stream)

    def memcpy_batch(
        self, dsts: int, srcs: int, sizes: int, count: int, stream: int, *, source_settled: bool = False
    ) -> None:
        """Copy each (dst, src, size) in stream order: one cudaMemcpyBatchAsync where available.

        `dsts`, `srcs`, `sizes`: addresses of `count` int64 each (read before this returns).
        `source_settled`: no earlier work on any stream writes the sources and they stay unchanged
        until the copies end, so the driver may read them out of stream order (destinations are
        still written in stream order).
        """
        if count == 0:
            return
        if self._batch is None or count == 1:
            columns = [(ctypes.c_int64 * count).from_address(a) for a in (dsts, srcs, sizes)]
            for d, s, n in zip(*columns, strict=True):
                self.memcpy(d, s, n, stream)
            return
        attrs = self._settled_attrs_address if source_settled else self._attrs_address
        tail = [attrs, self._attr_index_address, 1]
        if self._batch_has_fail_index:
            tail.append(self._fail_index_address)
        for first in range(0, count, BATCH_MAX):  # in stream order, chunk after chunk
            n, at = min(BATCH_MAX, count - first), 8 * first
            err = self._batch(dsts + at, srcs + at, sizes + at, n, *tail, stream)
            self.check(err, "cudaMemcpyBatchAsync")


def _function_address(fn: Any) -> int:
    return int(ctypes.cast(fn, _vp).value or 0)


def _address(values: np.ndarray) -> int:
    if values.dtype != np.int64 or not values.flags.c_contiguous:
        raise TypeError("memcpy_many takes contiguous int64 arrays")
    return values.ctypes.data


_loaded: CudaRuntime | None = None
_lock = threading.Lock()


def runtime() -> CudaRuntime:
    """The process's CUDA runtime (initialising CUDA through torch first)."""
    global _loaded
    with _lock:
        if _loaded is None:
            torch.cuda.init()
            _loaded = _load()
        return _loaded


def _load() -> CudaRuntime:
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "libcudart" in line})
    except OSError:
        paths = []
    found = ctypes.util.find_library("cudart")
    for path in paths + ([found] if found else []):
        try:
            return CudaRuntime(ctypes.CDLL(path), path)
        except (OSError, AttributeError):
            continue
    raise ECConnectorError(
        "TorchCopier on CUDA needs the CUDA runtime library (libcudart) that torch loads, and none is "
        "loaded in this process; use a torch build that links libcudart dynamically (the pip wheels do)"
    )
