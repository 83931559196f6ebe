"""Does a GPU kernel that reads or writes registered host memory start sooner on huge pages?

Issue #3: the copy kernel pays ~20 µs before its bytes on sub-MiB batches; one guess was the GPU's
translation of 4 KiB host pages. Here: two anonymous 1 GiB host buffers, one MADV_HUGEPAGE (THP),
one MADV_NOHUGEPAGE, each registered like the region (hostmem.acquire) and alternated twice; per
size, the median device time (events) of an elementwise kernel reading (load) or writing (save)
the mapped buffer at a fresh 8 MiB-strided offset per repetition, and of `copy_` (copy engine).
Prints the machine's THP settings and AnonHugePages after each buffer is made (proof of THP).

    PYTHONPATH=. python3 bench/thp_host_access.py        # CUDA only
"""

from __future__ import annotations

import ctypes
import mmap
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from ec_connector.adapters.torch_copy import hostmem

SIZE = 1 << 30
THP = Path("/sys/kernel/mm/transparent_hugepage")


def _settings() -> None:
    for name in ("enabled", "shmem_enabled", "defrag"):
        try:
            print(THP / name, (THP / name).read_text().strip())
        except OSError as err:
            print(THP / name, err)


def _huge_pages() -> str:
    lines = Path("/proc/meminfo").read_text().splitlines()
    return ", ".join(
        line.replace(" ", "") for line in lines if line.startswith(("AnonHugePages", "ShmemHuge"))
    )


def _timed(fn: Callable[[int], object], reps: int = 40) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for i in range(reps):
        start.record()
        fn(i)
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1000)
    return statistics.median(out[5:])


def _measure(view: torch.Tensor, dense: torch.Tensor, n: int) -> dict[str, float]:
    def at(i: int, k: int) -> int:
        return (i * 37 + k) * (8 << 20) % (SIZE - n)

    words = torch.int64
    return {
        "load-kernel": _timed(
            lambda i: torch.bitwise_or(view[at(i, 1) :][:n].view(words), 0, out=dense[:n].view(words))
        ),
        "save-kernel": _timed(
            lambda i: torch.bitwise_or(dense[:n].view(words), 0, out=view[at(i, 3) :][:n].view(words))
        ),
        "load-copy_": _timed(lambda i: dense[:n].copy_(view[at(i, 5) :][:n], non_blocking=True)),
    }


def main() -> int:
    device = torch.device("cuda", 0)
    _settings()
    dense = torch.empty(32 << 20, dtype=torch.uint8, device=device)
    res: dict[tuple[str, bool, float], list[float]] = {}
    for huge in (False, True, False, True):
        mm = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        mm.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
        buf = (ctypes.c_char * SIZE).from_buffer(mm)
        ctypes.memset(ctypes.addressof(buf), 1, SIZE)  # fault every page now
        print(f"huge={huge}: {_huge_pages()}")
        reg = hostmem.acquire(ctypes.addressof(buf), SIZE, device, name="thp" if huge else "small")
        view = hostmem.device_view(reg.device_address, SIZE, device)
        for mib in (0.25, 1, 4):
            for kind, us in _measure(view, dense, int(mib * (1 << 20))).items():
                res.setdefault((kind, huge, mib), []).append(us)
        del view
        hostmem.release(reg)
        del buf
        mm.close()
    for (kind, huge, mib), values in sorted(res.items()):
        print(f"{kind} huge={huge!s:5} {mib:5} MiB: {', '.join(f'{v:6.1f}' for v in values)} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
