"""Copy bandwidth of `TorchCopier` beside a contiguous pinned memcpy of the same bytes, in one run.

For rows of 2, 7 and 32 KiB (bf16 widths 1024, 3584, 16384), entries of 64 rows, 1, 8 and 16 MiB,
placed contiguously, by the project's allocator after random alloc/free churn ("churn"), by the
tier's entry table after aging full with 5% of its frees out of order and its run floor on ("aged",
`aging.py`), or as random runs of 1-16 blocks, the placement a full table without a run floor
drifts towards ("runs1-16"), and batches of 1 and 32 entries: save and load GB/s
(device time between the copier's own start/end events), the same bytes through one contiguous
pinned `cudaMemcpyAsync` measured alternately in the same process (queued with the same runtime
calls as the copier's batches), the ratio, and the host time of
the `save`/`load` call (what the engine's step thread pays). Every copy's bytes are verified.

    python -m ec_connector.benchmarks.copy_bandwidth  # CUDA if present, else CPU
    (options) --quick: a short run; --alternatives: also per-run memcpy and UVA index_copy_ /
    index_select; --gate-us 400: device time only (see below); --stream default: callers on the
    legacy default stream; --save-launcher off: saves queued by the calling thread

`ec-connector bench copy [--quick]` runs it and writes its JSON and a plot; `python
bench/copy_bandwidth.py` in a checkout is the same.

Saves go through the save launcher's thread by default, as the container builds every role's CUDA
copier; `--save-launcher off` has the calling thread queue them.

On CUDA the copier is called from a stream of the caller's own, as vLLM's model runner calls the
connector (vLLM's `current_stream()` makes one per process): a load wholly on the copy engines then
goes onto that stream itself. `--stream default` calls it from the legacy default stream, where such
a load is fenced onto a copy stream and joined back.

By default a batch's events also enclose the host's enqueue of its copies when the stream is idle
(the start event fires at once, the copies land as the host submits them), for the copier and the
memcpy alike. `--gate-us N` first holds the stream with an N µs spin kernel, so both are queued
before their start event fires and the events time the device's work alone; a call whose host time
exceeded the gate is counted in the summary (its figure still includes some enqueue time). Caveat: a
batch-1 entry of one run is the same single `cudaMemcpyAsync` as the memcpy, and its ratio swings
0.9-1.2x from one group of reps to the next (docs/benchmarks.md, "Copy bandwidth"), so read those
copier rows against the `contiguous` ones of the same run.

On CPU the copier's numbers are wall times of its synchronous copies, beside a contiguous copy_.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

import torch

from ec_connector.adapters.memory import MemoryRegion
from ec_connector.adapters.torch_copy import TorchCopier
from ec_connector.adapters.torch_copy.copier import DMA_MIN_BYTES
from ec_connector.benchmarks.placements import aged, churn, contiguous, entry_rows, scattered
from ec_connector.domain.blocks import Extent
from ec_connector.domain.layout import Layout
from ec_connector.domain.transfers import PlannedCopy, SaveJob

MiB = 1 << 20
WIDTHS = (1024, 3584, 16384)
ENTRIES = ("64rows", "1MiB", "8MiB", "16MiB")
LAYOUTS = ("contiguous", "churn", "aged", "runs1-16")
BATCHES = (1, 32)


@dataclass
class Row:
    width: int
    row_kib: float
    entry: str
    layout: str
    batch: int
    runs_per_entry: float
    mib: float
    save_gbs: float
    memcpy_d2h_gbs: float
    load_gbs: float
    memcpy_h2d_gbs: float
    save_host_us: float
    load_host_us: float
    over_gate: int = 0  # timed calls whose host time outlasted --gate-us (0 without a gate)

    @property
    def save_ratio(self) -> float:
        return self.save_gbs / self.memcpy_d2h_gbs

    @property
    def load_ratio(self) -> float:
        return self.load_gbs / self.memcpy_h2d_gbs


PLACE: dict[str, Callable[[int, int, int, random.Random], list[tuple[Extent, ...]]]] = {
    "contiguous": contiguous,
    "churn": churn,
    "runs1-16": scattered,
}


# -- one device's clock and baseline ---------------------------------------------------------


class Device:
    def __init__(self, name: str) -> None:
        self.cuda = name.startswith("cuda")
        self.device = torch.device(name)
        self._pinned = torch.empty(0, dtype=torch.uint8)
        self._dev = torch.empty(0, dtype=torch.uint8, device=self.device)
        self.gate_cycles = 0
        if self.cuda:
            from ec_connector.adapters.torch_copy.cudart import runtime

            self.stream = torch.cuda.Stream(self.device)
            self.e0 = torch.cuda.Event(enable_timing=True)
            self.e1 = torch.cuda.Event(enable_timing=True)
            self.rt = runtime()
            self._fence = self.rt.event(timing=False)
            self._start, self._end = self.rt.event(timing=True), self.rt.event(timing=True)

    def set_gate(self, us: float) -> None:
        """Calibrate the spin kernel so that `hold` keeps a stream busy for about `us` µs."""
        if not self.cuda or us <= 0:
            return
        probe = 1_000_000
        with torch.cuda.stream(self.stream):
            torch.cuda._sleep(probe)  # first launch loads the kernel
            self.e0.record()
            torch.cuda._sleep(probe)
            self.e1.record()
        self.e1.synchronize()
        self.gate_cycles = int(probe * us / (self.e0.elapsed_time(self.e1) * 1e3))

    def hold(self) -> None:
        """Queue the gate on the current stream (nothing without `--gate-us`)."""
        if self.gate_cycles:
            torch.cuda._sleep(self.gate_cycles)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def buffers(self, nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._pinned.numel() < nbytes:
            self._pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.cuda)
            self._dev = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            self._dev.random_(0, 256)
            self._pinned.random_(0, 256)
        return self._pinned[:nbytes], self._dev[:nbytes]

    def memcpy(self, dst: torch.Tensor, src: torch.Tensor, *, load: bool = False) -> float:
        """Seconds for one contiguous copy (events on CUDA, wall clock on CPU)."""
        if not self.cuda:
            t0 = time.perf_counter()
            dst.copy_(src)
            return time.perf_counter() - t0
        # queued as the copier queues a batch on the copy engines, with the same runtime calls: the
        # caller's stream (held by the gate, if any) is fenced into the copy stream, whose start
        # event then fires when the fence does; then one cudaMemcpyAsync and the end event. A load
        # from a stream of the caller's own goes onto that stream itself, start event and all, as
        # the copier's do (so both windows hold the same hand-over from the gate to the copy engine)
        rt = self.rt
        caller = torch.cuda.current_stream(self.device).cuda_stream
        self.hold()
        if load and caller:
            stream = caller
        else:
            stream = self.stream.cuda_stream
            rt.record(self._fence, caller)
            rt.wait(stream, self._fence)
        rt.record(self._start, stream)
        rt.memcpy(dst.data_ptr(), src.data_ptr(), dst.numel() * dst.element_size(), stream)
        rt.record(self._end, stream)
        rt.synchronize(self._end)
        return rt.elapsed(self._start, self._end)


def finish(dev: Device, copier: TorchCopier, copies: list[PlannedCopy]) -> float:
    """Wait for the batch, check poll reports exactly its tickets, return its timed seconds (the
    copier's own events)."""
    dev.sync()
    done: list[int] = []
    deadline = time.monotonic() + 60
    while copier.in_flight():
        done += copier.poll()
        assert time.monotonic() < deadline, "copies never completed"
    assert sorted(done) == sorted(c.ticket for c in copies), "poll did not report the batch"
    return sum(t.seconds for t in copier.drain_timings())


def random_rows(rows: int, width: int, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    raw = torch.randint(-(1 << 15), 1 << 15, (rows, width), dtype=torch.int16, generator=gen)
    return raw.view(torch.bfloat16).to(device)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], -1)


# -- the measurement -----------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, progress: Callable[[str], None] | None = None) -> None:
        self.args = args
        self.progress = progress or (lambda _line: None)
        self.dev = Device(args.device)
        self.dev.set_gate(args.gate_us)
        self.tickets = itertools.count(1)
        self.rows: list[Row] = []
        self.alternatives: list[dict[str, object]] = []

    def run_width(self, width: int, entries: tuple[str, ...], layouts: tuple[str, ...]) -> None:
        args, dev = self.args, self.dev
        row_bytes = width * 2
        largest = max(entry_rows(e, row_bytes) for e in entries) * max(args.batches)
        num_blocks = int(largest * 2.2) + 64
        region = MemoryRegion(Layout(hidden_dim=width, dtype="bfloat16", num_blocks=num_blocks), name="bench")
        t0 = time.perf_counter()
        copier = TorchCopier(
            region,
            device=dev.device,
            tile_bytes=args.tile_bytes,
            num_warps=args.num_warps,
            dma_min_bytes=args.dma_min_bytes,
            save_launcher=args.save_launcher == "on",
        )
        print(
            f"# width {width} ({row_bytes / 1024:g} KiB rows): region "
            f"{num_blocks * row_bytes / MiB:.0f} MiB, copier ready in {time.perf_counter() - t0:.2f}s",
            flush=True,
        )
        host_rows = torch.frombuffer(region.data(), dtype=torch.uint8).view(num_blocks, row_bytes)
        if dev.cuda:
            from ec_connector.adapters.torch_copy import hostmem

            reg = hostmem.acquire(host_rows.data_ptr(), num_blocks * row_bytes, dev.device, name="bench")
            check_rows = hostmem.device_view(reg.device_address, num_blocks * row_bytes, dev.device)
            check_rows = check_rows.view(num_blocks, row_bytes)
        else:
            reg, check_rows = None, host_rows
        gen = torch.Generator().manual_seed(width)
        rng = random.Random(width)
        try:
            for entry, layout, batch in itertools.product(entries, layouts, args.batches):
                rows = entry_rows(entry, row_bytes)
                if layout == "aged":
                    placement = aged(num_blocks, rows, batch, rng, row_bytes=row_bytes)
                else:
                    placement = PLACE[layout](num_blocks, rows, batch, rng)
                self.measure(copier, check_rows, host_rows, width, entry, layout, rows, placement, gen)
                self.progress(f"{row_bytes // 1024} KiB rows, {entry}, {layout}, batch {batch}")
        finally:
            del check_rows
            if reg is not None:
                hostmem.release(reg)
            copier.close()
            del host_rows
            region.close()

    def measure(
        self,
        copier: TorchCopier,
        check_rows: torch.Tensor,
        host_rows: torch.Tensor,
        width: int,
        entry: str,
        layout: str,
        rows: int,
        placement: list[tuple[Extent, ...]],
        gen: torch.Generator,
    ) -> None:
        dev, reps = self.dev, self.args.reps
        row_bytes = width * 2
        batch = len(placement)
        nbytes = rows * row_bytes * batch
        sets = [[random_rows(rows, width, dev.device, gen) for _ in placement] for _ in range(2)]
        expected = [torch.cat([as_bytes(p) for p in s]) for s in sets]
        index = torch.tensor(
            [b for ext in placement for e in ext for b in range(e.start, e.end)], dtype=torch.int64
        ).to(dev.device)
        pinned, devbuf = dev.buffers(nbytes)
        save_s, load_s, d2h_s, h2d_s, save_host, load_host = [], [], [], [], [], []
        over_gate = 0
        for rep in range(reps + 1):  # the first round warms up and is not counted
            which = rep % 2
            d2h = dev.memcpy(pinned, devbuf)
            copies = [PlannedCopy(next(self.tickets), f"e{i}", ext, rows) for i, ext in enumerate(placement)]
            jobs = [SaveJob(c, p) for c, p in zip(copies, sets[which], strict=True)]
            dev.sync()
            dev.hold()
            t0 = time.perf_counter()
            copier.save(jobs)
            t_save = time.perf_counter() - t0
            save_dev = finish(self.dev, copier, copies)
            if not torch.equal(check_rows.index_select(0, index), expected[which]):
                raise SystemExit(f"save bytes differ: width {width} {entry} {layout} batch {batch}")
            h2d = dev.memcpy(devbuf, pinned, load=True)
            loads = [PlannedCopy(next(self.tickets), f"e{i}", ext, rows) for i, ext in enumerate(placement)]
            dev.sync()
            dev.hold()
            t0 = time.perf_counter()
            out = copier.load(loads)
            t_load = time.perf_counter() - t0
            load_dev = finish(self.dev, copier, loads)
            if not torch.equal(torch.cat([as_bytes(cast(torch.Tensor, o)) for o in out]), expected[which]):
                raise SystemExit(f"load bytes differ: width {width} {entry} {layout} batch {batch}")
            del out
            if rep:
                save_s.append(save_dev)
                load_s.append(load_dev)
                d2h_s.append(d2h)
                h2d_s.append(h2d)
                save_host.append(t_save)
                load_host.append(t_load)
                if dev.gate_cycles:
                    over_gate += sum(t * 1e6 > self.args.gate_us for t in (t_save, t_load))
        med = statistics.median
        row = Row(
            width=width,
            row_kib=row_bytes / 1024,
            entry=entry,
            layout=layout,
            batch=batch,
            runs_per_entry=sum(len(p) for p in placement) / batch,
            mib=nbytes / MiB,
            save_gbs=nbytes / med(save_s) / 1e9,
            memcpy_d2h_gbs=nbytes / med(d2h_s) / 1e9,
            load_gbs=nbytes / med(load_s) / 1e9,
            memcpy_h2d_gbs=nbytes / med(h2d_s) / 1e9,
            save_host_us=med(save_host) * 1e6,
            load_host_us=med(load_host) * 1e6,
            over_gate=over_gate,
        )
        self.rows.append(row)
        print(format_row(row), flush=True)
        if self.args.alternatives and dev.cuda and layout != "contiguous":
            self.measure_alternatives(check_rows, host_rows, row, placement, expected[0], index)

    def measure_alternatives(
        self,
        check_rows: torch.Tensor,
        host_rows: torch.Tensor,
        row: Row,
        placement: list[tuple[Extent, ...]],
        source: torch.Tensor,
        index: torch.Tensor,
    ) -> None:
        """The designs not chosen, on the same placement: per-run memcpy, UVA index_copy_/index_select."""
        dev = self.dev
        runs = [(e.start, e.length) for ext in placement for e in ext]
        stream, e0, e1 = dev.stream, dev.e0, dev.e1
        nbytes = source.numel()

        def timed(fn: Callable[[], None]) -> tuple[float, float]:
            dev.sync()
            with torch.cuda.stream(stream):
                e0.record()
                t0 = time.perf_counter()
                fn()
                host = time.perf_counter() - t0
                e1.record()
            e1.synchronize()
            return e0.elapsed_time(e1) / 1e3, host

        def per_run_save() -> None:
            pos = 0
            for s, n in runs:
                host_rows[s : s + n].copy_(source[pos : pos + n], non_blocking=True)
                pos += n

        out = torch.empty_like(source)

        def per_run_load() -> None:
            pos = 0
            for s, n in runs:
                out[pos : pos + n].copy_(host_rows[s : s + n], non_blocking=True)
                pos += n

        def uva_save() -> None:
            check_rows.index_copy_(0, index, source)

        def uva_load() -> None:
            torch.index_select(check_rows, 0, index, out=out)

        for name, save_fn, load_fn in (
            ("memcpy-per-run", per_run_save, per_run_load),
            ("uva-index", uva_save, uva_load),
        ):
            results = {}
            for direction, fn in (("save", save_fn), ("load", load_fn)):
                samples = []
                for _ in range(max(2, self.args.reps // 2) + 1):
                    out.zero_()
                    samples.append(timed(fn))
                    ok = (
                        torch.equal(check_rows.index_select(0, index), source)
                        if direction == "save"
                        else torch.equal(out, source)
                    )
                    if not ok:
                        raise SystemExit(f"{name} {direction} bytes differ")
                dev_s = statistics.median(s for s, _ in samples[1:])
                host_s = statistics.median(h for _, h in samples[1:])
                results[direction] = (nbytes / dev_s / 1e9, host_s * 1e6)
            record = {
                "method": name,
                "width": row.width,
                "entry": row.entry,
                "layout": row.layout,
                "batch": row.batch,
                "runs": len(runs),
                "save_gbs": results["save"][0],
                "save_host_us": results["save"][1],
                "load_gbs": results["load"][0],
                "load_host_us": results["load"][1],
            }
            self.alternatives.append(record)
            print(
                f"    alt {name:15s} save {results['save'][0]:6.1f} GB/s ({results['save'][1]:8.0f} us host)"
                f"  load {results['load'][0]:6.1f} GB/s ({results['load'][1]:8.0f} us host)"
                f"  [{len(runs)} runs]",
                flush=True,
            )


HEADER = (
    f"{'row':>6} {'entry':>6} {'layout':>10} {'runs/e':>7} {'batch':>5} {'MiB':>7} | "
    f"{'save':>6} {'d2h':>6} {'ratio':>5} | {'load':>6} {'h2d':>6} {'ratio':>5} | "
    f"{'save us':>8} {'load us':>8}"
)


def format_row(r: Row) -> str:
    return (
        f"{r.row_kib:5g}K {r.entry:>6} {r.layout:>10} {r.runs_per_entry:7.1f} {r.batch:5d} {r.mib:7.2f} | "
        f"{r.save_gbs:6.1f} {r.memcpy_d2h_gbs:6.1f} {r.save_ratio:5.2f} | "
        f"{r.load_gbs:6.1f} {r.memcpy_h2d_gbs:6.1f} {r.load_ratio:5.2f} | "
        f"{r.save_host_us:8.0f} {r.load_host_us:8.0f}"
    )


def summary(rows: list[Row]) -> list[str]:
    def worst(select: Callable[[Row], bool]) -> str:
        chosen = [r for r in rows if select(r)]
        if not chosen:
            return "n/a"
        return f"save {min(r.save_ratio for r in chosen):.2f}x, load {min(r.load_ratio for r in chosen):.2f}x"

    big = [r for r in rows if r.entry in ("1MiB", "8MiB", "16MiB")]
    placed = ("churn", "aged")  # fragmented as the tier's own table places entries
    lines = [
        f"fragmented 1-16 MiB entries as the tier places them (churn, aged), worst ratio: "
        f"{worst(lambda r: r in big and r.layout in placed)}  (target >= 0.90x)",
        f"contiguous 1-16 MiB entries, worst ratio: {worst(lambda r: r in big and r.layout == 'contiguous')}",
        f"random 1-16-block runs of 1-16 MiB (runs1-16: no run floor), worst ratio: "
        f"{worst(lambda r: r in big and r.layout == 'runs1-16')}",
        f"64-row entries, worst ratio: {worst(lambda r: r.entry == '64rows')}  (target >= 0.70x)",
        f"64-row entries, batch 32, worst ratio: {worst(lambda r: r.entry == '64rows' and r.batch == 32)}",
    ]
    over = [r for r in rows if r.over_gate]
    if over:
        lines.append(
            f"host time outlasted the gate in {sum(r.over_gate for r in over)} timed calls of "
            f"{len(over)} rows (their figures include some host enqueue time)"
        )
    b32 = [r for r in rows if r.batch == 32]
    for layout in LAYOUTS:
        sel = [r for r in b32 if r.layout == layout]
        if sel:
            lines.append(
                f"batch of 32, {layout}: host launch max save {max(r.save_host_us for r in sel):.0f} us, "
                f"load {max(r.load_host_us for r in sel):.0f} us; median save "
                f"{statistics.median(r.save_host_us for r in sel):.0f} us, load "
                f"{statistics.median(r.load_host_us for r in sel):.0f} us  (target <= 100 us)"
            )
    if b32:
        lines.append(
            "(host launch here: each case's few timed calls, each after large copies or a gate; "
            "bench/copy_host_launch.py times launches alone, many calls per case)"
        )
    return lines


def add_stream_option(parser: argparse.ArgumentParser) -> None:
    """`--stream own|default`: where the copier's caller runs (the CUDA benches share it)."""
    parser.add_argument(
        "--stream",
        choices=("own", "default"),
        default="own",
        help="the caller's stream: one of its own, as vLLM's model runner has (default), or the "
        "legacy default stream",
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="64-row and 1 MiB entries, 3 repetitions")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions per case (default 7)")
    parser.add_argument("--widths", type=int, nargs="*", default=None)
    parser.add_argument("--entries", nargs="*", default=None, choices=ENTRIES)
    parser.add_argument("--layouts", nargs="*", default=None, choices=LAYOUTS)
    parser.add_argument("--batches", type=int, nargs="*", default=list(BATCHES))
    parser.add_argument("--tile-bytes", type=int, default=16384)
    parser.add_argument("--num-warps", type=int, default=4)
    parser.add_argument(
        "--dma-min-bytes",
        type=lambda v: None if v == "none" else int(v),
        default=DMA_MIN_BYTES,
        help="runs this long or longer use the copy engines ('none': the kernel copies every run)",
    )
    parser.add_argument(
        "--alternatives", action="store_true", help="also time per-run memcpy and UVA index ops"
    )
    parser.add_argument(
        "--gate-us",
        type=float,
        default=0.0,
        help="hold the stream this long before each timed copy so events time device work only (CUDA)",
    )
    add_stream_option(parser)
    parser.add_argument(
        "--save-launcher",
        choices=("on", "off"),
        default="on",
        help="saves queued by the save launcher's thread (on, every role's default) or the caller's",
    )
    parser.add_argument("--json", type=Path, default=None, help="write every number here")
    args = parser.parse_args(argv)
    args.entries = tuple(args.entries or (("64rows", "1MiB") if args.quick else ENTRIES))
    args.layouts = tuple(args.layouts or LAYOUTS)
    args.widths = tuple(args.widths or WIDTHS)
    args.reps = args.reps or (3 if args.quick else 7)
    return args


def cases(args: argparse.Namespace) -> int:
    """How many (width, entry, layout, batch) cases `run` measures."""
    return len(args.widths) * len(args.entries) * len(args.layouts) * len(args.batches)


def run(args: argparse.Namespace, progress: Callable[[str], None] | None = None) -> dict[str, object]:
    """Measure every case (printing the table as it goes); returns every number (what --json writes)."""
    bench = Bench(args, progress)
    dev = bench.dev
    print(f"# device {dev.device}" + (f" ({torch.cuda.get_device_name(dev.device)})" if dev.cuda else ""))
    print(
        f"# torch {torch.__version__}, tile_bytes {args.tile_bytes}, num_warps {args.num_warps}, "
        f"dma_min_bytes {args.dma_min_bytes}, reps {args.reps}, gate {args.gate_us:g} us, "
        f"caller on {'a stream of its own' if args.stream == 'own' else 'the legacy default stream'}"
    )
    if dev.cuda:
        import triton

        print(f"# triton {triton.__version__}")
    print(
        "# GB/s = 1e9 bytes/s; save = device->region, load = region->device; "
        "d2h/h2d = contiguous pinned memcpy"
    )
    print(HEADER, flush=True)
    caller = torch.cuda.Stream(dev.device) if dev.cuda and args.stream == "own" else None
    with torch.cuda.stream(caller):  # None: the current (default) stream, and a no-op on CPU
        for width in args.widths:
            bench.run_width(width, args.entries, args.layouts)
    print()
    print(HEADER)
    for row in bench.rows:
        print(format_row(row))
    print()
    for line in summary(bench.rows):
        print(line)
    return {
        "device": str(dev.device),
        "name": torch.cuda.get_device_name(dev.device) if dev.cuda else "cpu",
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "rows": [asdict(r) | {"save_ratio": r.save_ratio, "load_ratio": r.load_ratio} for r in bench.rows],
        "alternatives": bench.alternatives,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    payload = run(args)
    if args.json:
        args.json.write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
