"""One Triton kernel that copies a whole batch of runs between the region and device memory.

The host stages only the run table of the batch, three int64 columns of `n_runs` values:

    first[i]  dense row where run i begins (runs back to back, batch order; first[0] = 0)
    start[i]  region block where run i begins
    delta[i]  word offset added to `row * row_words` on the dense side (saves: it points the rows
              of each entry at that entry's own tensor; loads use one tensor and no delta)

When the kernel has at most sixteen runs, they are passed as kernel arguments instead (each with
its dense word offset, so loads and saves alike): no table upload, which is a copy-engine copy the
kernel must wait for (several µs, most of what a small scattered entry costs beyond its bytes).

Each program copies a `BLOCK_R × BLOCK_C` tile of (dense row, word) pairs: it finds each row's run
by binary search over `first` (a few cached loads), then moves the tile with 16-byte accesses where
alignment allows (VEC words per access). The region side is its mapped (UVA) device address, so the
kernel reads or writes host memory over PCIe directly: one launch whatever the fragmentation. The
engine gives it only the runs shorter than `dma_min_bytes`; longer ones go to the copy engines.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from ec_connector.adapters.torch_copy import triton_api

INLINE_RUNS = 16
_INLINE_ARGS = (
    [f"f{i}" for i in range(1, INLINE_RUNS)]
    + [f"s{i}" for i in range(INLINE_RUNS)]
    + [f"o{i}" for i in range(INLINE_RUNS)]
)


@triton.jit
def _inline_run(rows, f, s, o, first, start, offset):
    """Move each row's run (first, start, offset) on to the run beginning at batch row `f` if it is there."""
    past = rows >= f
    return tl.where(past, f, first), tl.where(past, s, start), tl.where(past, o, offset)


@triton.jit(do_not_specialize=["n_runs", "total_rows", "top", "nsteps", *_INLINE_ARGS])
def _copy_runs(
    host,
    dense,
    table,
    n_runs,
    total_rows,
    top,
    nsteps,
    row_words,
    f1,
    f2,
    f3,
    f4,
    f5,
    f6,
    f7,
    f8,
    f9,
    f10,
    f11,
    f12,
    f13,
    f14,
    f15,
    s0,
    s1,
    s2,
    s3,
    s4,
    s5,
    s6,
    s7,
    s8,
    s9,
    s10,
    s11,
    s12,
    s13,
    s14,
    s15,
    o0,
    o1,
    o2,
    o3,
    o4,
    o5,
    o6,
    o7,
    o8,
    o9,
    o10,
    o11,
    o12,
    o13,
    o14,
    o15,
    SAVE: tl.constexpr,
    DELTA: tl.constexpr,
    INLINE: tl.constexpr,
    VEC: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < total_rows
    rows64 = rows.to(tl.int64)
    if INLINE:
        # up to sixteen runs passed as arguments (unused: f = total_rows): no table, no upload;
        # run i's rows go to dense words o_i + (row - f_i) * row_words
        first = tl.zeros([BLOCK_R], dtype=tl.int64)
        start = tl.zeros([BLOCK_R], dtype=tl.int64) + s0
        offset = tl.zeros([BLOCK_R], dtype=tl.int64) + o0
        first, start, offset = _inline_run(rows, f1, s1, o1, first, start, offset)
        first, start, offset = _inline_run(rows, f2, s2, o2, first, start, offset)
        first, start, offset = _inline_run(rows, f3, s3, o3, first, start, offset)
        first, start, offset = _inline_run(rows, f4, s4, o4, first, start, offset)
        first, start, offset = _inline_run(rows, f5, s5, o5, first, start, offset)
        first, start, offset = _inline_run(rows, f6, s6, o6, first, start, offset)
        first, start, offset = _inline_run(rows, f7, s7, o7, first, start, offset)
        first, start, offset = _inline_run(rows, f8, s8, o8, first, start, offset)
        first, start, offset = _inline_run(rows, f9, s9, o9, first, start, offset)
        first, start, offset = _inline_run(rows, f10, s10, o10, first, start, offset)
        first, start, offset = _inline_run(rows, f11, s11, o11, first, start, offset)
        first, start, offset = _inline_run(rows, f12, s12, o12, first, start, offset)
        first, start, offset = _inline_run(rows, f13, s13, o13, first, start, offset)
        first, start, offset = _inline_run(rows, f14, s14, o14, first, start, offset)
        first, start, offset = _inline_run(rows, f15, s15, o15, first, start, offset)
        hoff = (start + rows64 - first) * row_words
        doff = offset + (rows64 - first) * row_words
    else:
        run = tl.zeros([BLOCK_R], dtype=tl.int32)
        step = top
        for _ in range(nsteps):
            cand = run + step
            first = tl.load(table + cand, mask=rmask & (cand < n_runs), other=total_rows)
            run = tl.where(first <= rows64, cand, run)
            step = step // 2
        first = tl.load(table + run, mask=rmask, other=0)
        start = tl.load(table + n_runs + run, mask=rmask, other=0)
        hoff = (start + rows64 - first) * row_words
        doff = rows64 * row_words
        if DELTA:
            doff += tl.load(table + 2 * n_runs + run, mask=rmask, other=0)
    hoff = tl.multiple_of(hoff, VEC)
    doff = tl.multiple_of(doff, VEC)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = rmask[:, None] & (cols < row_words)[None, :]
    hptr = host + hoff[:, None] + cols[None, :]
    dptr = dense + doff[:, None] + cols[None, :]
    if SAVE:
        tl.store(hptr, tl.load(dptr, mask=mask), mask=mask)
    else:
        tl.store(dptr, tl.load(hptr, mask=mask), mask=mask)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.cache
def tile(row_words: int, word: int, tile_bytes: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_C): columns up to 4 KiB of a row, then rows (a power of two) to fill `tile_bytes`."""
    block_c = min(1 << (row_words - 1).bit_length(), max(1, 4096 // word))
    block_r = 1
    while block_r * 2 * block_c * word <= tile_bytes:
        block_r *= 2
    return block_r, block_c


_NO_INLINE = (0,) * len(_INLINE_ARGS)


class Launcher:
    """The copy kernel's compiled variants for one region, launched straight onto a raw stream.

    `JITFunction.__call__` re-derives the specialisation of every argument on each launch (tens of
    µs of Python); here each variant is compiled once (`warmup`) under a key holding everything
    Triton specialises on for this kernel (the constexprs, the word type, whether the dense pointer
    is 16-byte aligned; the region pointer, the table and `row_words` are fixed per region), then
    launched through the compiled kernel's own launcher (private Triton APIs: triton_api.py).
    """

    def __init__(self, row_bytes: int, *, tile_bytes: int, num_warps: int) -> None:
        self.row_bytes = row_bytes
        self.tile_bytes = tile_bytes
        self.num_warps = num_warps
        self._compiled: dict[tuple[object, ...], triton_api.Compiled] = {}

    def bind(
        self,
        host: torch.Tensor,
        dense: torch.Tensor,
        table: torch.Tensor,
        *,
        word: int,
        vec: int,
        n_runs: int,
        total_rows: int,
        inline: tuple[int, ...] | None,
        save: bool,
        delta: bool,
    ) -> Callable[[int], None] | None:
        """Everything but the launch itself; the returned function launches onto a raw stream.

        Done before the batch's first stream operation, so that the copy starts as soon as queued.
        """
        if total_rows == 0:
            return None
        args = self._args(host, dense, table, word, vec, n_runs, total_rows, inline, save, delta)
        dense_aligned = dense.data_ptr() % 16 == 0
        compiled = self._kernel((save, delta, inline is not None, word, vec, dense_aligned), args)
        # pointers as plain ints: the launcher takes them as they are, without calling data_ptr()
        launch_args = (host.data_ptr(), dense.data_ptr(), table.data_ptr(), *args[3:])
        # plain integer division: triton.cdiv is a JIT function, several µs per call from Python
        g0, g1 = _cdiv(total_rows, args[-2]), _cdiv(args[7], args[-1])  # type: ignore[arg-type]
        return triton_api.launch(compiled, (g0, g1), launch_args)

    def prepare(
        self,
        host: torch.Tensor,
        dense: torch.Tensor,
        table: torch.Tensor,
        *,
        word: int,
        vec: int,
        inline: bool,
        save: bool,
        delta: bool,
    ) -> None:
        """Compile a variant without launching it."""
        args = self._args(host, dense, table, word, vec, 1, 1, _NO_INLINE if inline else None, save, delta)
        self._kernel((save, delta, inline, word, vec, dense.data_ptr() % 16 == 0), args)

    def _args(
        self,
        host: object,
        dense: object,
        table: object,
        word: int,
        vec: int,
        n_runs: int,
        total_rows: int,
        inline: tuple[int, ...] | None,
        save: bool,
        delta: bool,
    ) -> tuple[object, ...]:
        row_words = self.row_bytes // word
        block_r, block_c = tile(row_words, word, self.tile_bytes)
        nsteps = (n_runs - 1).bit_length()
        top = 1 << (nsteps - 1) if nsteps else 0
        return (
            host,
            dense,
            table,
            n_runs,
            total_rows,
            top,
            nsteps,
            row_words,
            *(inline or _NO_INLINE),
            save,
            delta,
            inline is not None,
            vec,
            block_r,
            block_c,
        )

    def _kernel(self, key: tuple[object, ...], args: tuple[object, ...]) -> triton_api.Compiled:
        entry = self._compiled.get(key)
        if entry is None:
            entry = self._compiled[key] = self._compile(args)
        return entry

    def _compile(self, args: tuple[object, ...]) -> triton_api.Compiled:
        *plain, save, delta, inline, vec, block_r, block_c = args
        return triton_api.compile_variant(
            _copy_runs,
            tuple(plain),
            SAVE=save,
            DELTA=delta,
            INLINE=inline,
            VEC=vec,
            BLOCK_R=block_r,
            BLOCK_C=block_c,
            num_warps=self.num_warps,
            grid=(1,),
        )
