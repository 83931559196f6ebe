"""Entry points of our own for the native code that queues copy-engine batches (queue.h).

launcher.c and batchplan.c call whatever C entry points they are given; here they are ctypes
callbacks that log each call, so the order of a batch's stream operations, its copy columns, the cut
into calls of `batch_max` and failures are checked without a GPU. The CUDA contract and worker
suites run the same code against the real runtime on the GPU machine.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from ec_connector.adapters.torch_copy.cudart import EntryPoints

_vp, _sz, _int = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
SET_DEVICE = ctypes.CFUNCTYPE(_int, _int)
WAIT = ctypes.CFUNCTYPE(_int, _vp, _vp, ctypes.c_uint)
RECORD = ctypes.CFUNCTYPE(_int, _vp, _vp)
MEMCPY = ctypes.CFUNCTYPE(_int, _vp, _vp, _sz, _int, _vp)
BATCH13 = ctypes.CFUNCTYPE(_int, _vp, _vp, _vp, _sz, _vp, _vp, _sz, _vp)
BATCH12 = ctypes.CFUNCTYPE(_int, _vp, _vp, _vp, _sz, _vp, _vp, _sz, _vp, _vp)
ATTRS, SETTLED_ATTRS, ATTR_INDEX = 0xA770, 0xA771, 0x1D0


class Runtime:
    """Entry points that log their calls; `fail` maps (call name, nth call of that name) to an error."""

    def __init__(self, *, fail_index: bool = False, batch_max: int = 256) -> None:
        self.calls: list[tuple] = []
        self.attrs: list[int] = []  # each batch call's attributes
        self._driver_table: np.ndarray | None = None
        self.threads: set[int] = set()
        self.fail: dict[tuple[str, int], int] = {}
        self._seen: dict[str, int] = {}

        def log(name: str, *args: object) -> int:
            self.threads.add(threading.get_ident())
            nth = self._seen.get(name, 0)
            self._seen[name] = nth + 1
            self.calls.append((name, *args))
            return self.fail.get((name, nth), 0)

        def columns(d: int, s: int, n: int, count: int) -> list[tuple[int, int, int]]:
            cols = [list((ctypes.c_int64 * count).from_address(a)) for a in (d, s, n)]
            return list(zip(*cols, strict=True))

        def batch(d, s, n, count, attrs, index, n_attrs, *rest):  # type: ignore[no-untyped-def]
            assert (attrs in (ATTRS, SETTLED_ATTRS), index, n_attrs) == (True, ATTR_INDEX, 1)
            self.attrs.append(attrs)
            stream = rest[-1]
            if fail_index:
                assert rest[0], "CUDA 12.8-12.9 take a failIdx pointer before the stream"
            return log("batch", stream, columns(d, s, n, count))

        self._keep = [
            SET_DEVICE(lambda device: log("device", device)),
            WAIT(lambda stream, event, flags: log("wait", stream, event)),
            RECORD(lambda event, stream: log("record", event, stream)),
            MEMCPY(lambda d, s, n, kind, stream: log("memcpy", stream, [(d, s, n)])),
            (BATCH12 if fail_index else BATCH13)(batch),
        ]
        address = [ctypes.cast(fn, _vp).value or 0 for fn in self._keep]
        self.entry = EntryPoints(*address, fail_index, ATTRS, ATTR_INDEX, batch_max)  # type: ignore[arg-type]

    def driver_table(self) -> np.ndarray:
        """queue.h's ec_driver_t over these entry points (what CudaRuntime.driver_table gives), made
        once and kept alive here, as the real runtime keeps its own."""
        if self._driver_table is None:
            e = self.entry
            values = [
                e.wait,
                e.record,
                e.memcpy,
                e.batch,
                int(e.batch_has_fail_index),
                e.batch_max,
                e.attr_index,
            ]
            self._driver_table = np.array(values, dtype=np.int64)
        return self._driver_table
