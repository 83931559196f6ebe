"""The payloads of `bench/compare_p2p.py`: what both sides move, and how a consumer checks it.

Rows are 7 KiB (bf16, hidden 3584); an item's bytes are a pattern seeded by its key, so the
consumer can rebuild what the producer wrote and compare every byte with `verify_runs`. Both sides'
processes import this module: neither side's code decides what is measured or how it is checked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

MiB = 1 << 20
HIDDEN = 3584
ROW_BYTES = HIDDEN * 2  # bf16
PAYLOADS_MIB = (1, 9, 32)
ITEM_TIMEOUT_S = 60.0
ACK_TIMEOUT_S = 10.0


def rows_for(mib: int) -> int:
    return max(1, round(mib * MiB / ROW_BYTES))


def pattern(key: str, nbytes: int):
    import numpy as np

    seed = int.from_bytes(key.encode()[-8:].rjust(8, b"\0"), "little")
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def prefault(area) -> None:
    """Write one byte per page of a region's data area (a flat byte array) from this process."""
    area[::4096] = 0


def verify_runs(area, runs: list[tuple[int, int]], expected) -> bool:
    """Compare each contiguous run of blocks (start, count) with the expected rows, in order.

    Every byte, with libc's `memcmp` over each run (the same check for both sides): ~1.1 ms per
    9 MiB on the CPU VM where numpy's `array_equal` over 8-byte words took ~2.0 ms and a byte-wise
    one ~2.7 ms. The check is not either connector's work, so the cheapest exact one keeps the
    end-to-end figures about the connectors.
    """
    done = 0
    for start, count in runs:
        got, want = area[start : start + count], expected[done : done + count]
        if got.shape != want.shape or not (got.flags.c_contiguous and want.flags.c_contiguous):
            raise ValueError(f"run ({start}, {count}) does not match the expected rows' layout")
        if _memcmp(got.ctypes.data, want.ctypes.data, got.nbytes) != 0:
            return False
        done += count
    return done == len(expected)


def _libc_memcmp() -> Callable[[int, int, int], int]:
    import ctypes

    fn = ctypes.CDLL(None).memcmp
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_memcmp = _libc_memcmp()


def block_runs(block_ids) -> list[tuple[int, int]]:
    """(start, count) runs of consecutive block ids, in the order given."""
    runs: list[list[int]] = []
    for b in block_ids:
        if runs and runs[-1][0] + runs[-1][1] == b:
            runs[-1][1] += 1
        else:
            runs.append([b, 1])
    return [(a, n) for a, n in runs]


def stored_items(peer, items) -> Iterator[tuple[str, int, Any, Any]]:  # noqa: ANN001
    """Wait for the producer process, then have it store each (key, rows) item; yields
    (key, rows, the bytes a READ must bring, the producer's ec_transfer_params)."""
    kind, detail = peer.recv()
    if kind != "up":
        raise RuntimeError(f"producer failed:\n{detail}")
    for key, rows in items:
        peer.send(("put", key, rows))
        kind, params = peer.recv()
        if kind != "params":
            raise RuntimeError(f"producer: {params}")
        yield key, rows, pattern(key, rows * ROW_BYTES).reshape(rows, ROW_BYTES), params


def check_and_clear(area, key: str, runs: list[tuple[int, int]], expected) -> float:
    """Verify an item's runs against the expected rows (`verify_runs`), then zero them so stale
    bytes cannot pass a later check; returns `time.perf_counter()` once the check ended (the end of
    the item's `e2e`). Raises AssertionError if the bytes differ."""
    ok = verify_runs(area, runs, expected)
    t1 = time.perf_counter()
    for start, count in runs:
        area[start : start + count] = 0
    if not ok:
        raise AssertionError(f"bytes differ for {key}")
    return t1


def record_item(out: dict, i: int, rows: int, t0: float, t_read: float, t1: float, **figures: float) -> None:
    """Add one item's figures to a consumer's result: the first item after connecting (cold) as
    `out["cold"]`, the others to `out["items"]`; `e2e_s` = t1 - t0, `read_s` = t_read - t0."""
    rec = {"size_bytes": rows * ROW_BYTES, "e2e_s": t1 - t0, "read_s": t_read - t0, **figures}
    if i == 0:
        out["cold"] = rec
    else:
        out["items"].append(rec)
