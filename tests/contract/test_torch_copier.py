"""What `TorchCopier` promises beyond the Copier port: messages, dtypes, alignment, streams, lifetimes.

The CUDA tests run against the real GPU (skipped without one); nothing here is mocked.
"""

from __future__ import annotations

import itertools
import random
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ec_connector.adapters.memory import MemoryRegion
from ec_connector.adapters.torch_copy import TorchCopier
from ec_connector.adapters.torch_copy.cudart import BATCH_MAX
from ec_connector.domain.blocks import Extent
from ec_connector.domain.errors import LayoutMismatch, RegionError
from ec_connector.domain.layout import Layout
from ec_connector.domain.transfers import PlannedCopy, SaveJob

LAYOUT = Layout(hidden_dim=48, dtype="bfloat16", num_blocks=4096)
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=CUDA)]
_tickets = itertools.count(1)


@pytest.fixture
def region() -> Iterator[MemoryRegion]:
    made = MemoryRegion(LAYOUT, name="torch-copier")
    yield made
    made.close()


@pytest.fixture(params=DEVICES)
def copier(request: pytest.FixtureRequest, region: MemoryRegion) -> Iterator[TorchCopier]:
    made = TorchCopier(region, device=request.param)
    yield made
    made.close()


def planned(extents: tuple[Extent, ...]) -> PlannedCopy:
    return PlannedCopy(next(_tickets), "item", extents, sum(e.length for e in extents))


def payload(rows: int, layout: Layout, device: torch.device | str, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (rows, layout.block_size_bytes), dtype=torch.uint8, generator=gen)
    return raw.view(getattr(torch, layout.dtype)).to(device)


def as_bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()


def region_bytes(region: MemoryRegion, extents: tuple[Extent, ...]) -> bytes:
    b = region.layout.block_size_bytes
    view = region.data()
    return b"".join(bytes(view[e.start * b : e.end * b]) for e in extents)


def drain(copier: TorchCopier, timeout_s: float = 20.0) -> list[int]:
    seen: list[int] = []
    deadline = time.monotonic() + timeout_s
    while copier.in_flight():
        seen += copier.poll()
        assert time.monotonic() < deadline
        time.sleep(0.001)
    return seen


def payloads(entries: list[tuple[Extent, ...]], layout: Layout, device: str) -> list[torch.Tensor]:
    return [payload(sum(e.length for e in ext), layout, device, seed=i) for i, ext in enumerate(entries)]


def round_trip(
    copier: TorchCopier, region: MemoryRegion, entries: list[tuple[Extent, ...]], sources: list[torch.Tensor]
) -> None:
    """Save `sources[i]` into `entries[i]` in one batch, check the region's bytes, load them all back
    in one batch and compare."""
    copier.save([SaveJob(planned(ext), src) for ext, src in zip(entries, sources, strict=True)])
    drain(copier)
    for ext, src in zip(entries, sources, strict=True):
        assert region_bytes(region, ext) == as_bytes(src)
    out = copier.load([planned(ext) for ext in entries])
    assert [as_bytes(o) for o in out] == [as_bytes(s) for s in sources]
    drain(copier)


def scattered(rows: int, *, num_blocks: int, seed: int) -> tuple[Extent, ...]:
    rng = random.Random(seed)
    starts = sorted(rng.sample(range(0, num_blocks, 2), rows))  # every other block: runs of 1
    return tuple(Extent(s, 1) for s in starts)


# -- on every device ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda d: b"rows", "is a bytes; expected a torch.Tensor"),
        (lambda d: torch.zeros(6 * 48, dtype=torch.bfloat16, device=d), "1 dimensions"),
        (lambda d: torch.zeros(6, 48, dtype=torch.float16, device=d), "dtype is torch.float16"),
        (lambda d: torch.zeros(6, 47, dtype=torch.bfloat16, device=d), "width is 47"),
        (lambda d: torch.zeros(5, 48, dtype=torch.bfloat16, device=d), "5 rows but its entry holds 6"),
        (lambda d: torch.zeros(6, 48, dtype=torch.bfloat16, device="meta"), "is on meta"),
    ],
    ids=["type", "rank", "dtype", "width", "rows", "device"],
)
def test_check_names_the_problem(copier: TorchCopier, make: object, words: str) -> None:
    with pytest.raises(LayoutMismatch, match=words):
        copier.check(make(copier.device), 6)  # type: ignore[operator]


def test_a_non_contiguous_payload_is_saved_by_value(region: MemoryRegion, copier: TorchCopier) -> None:
    wide = payload(9, Layout(hidden_dim=96, dtype="bfloat16", num_blocks=1), copier.device)
    view = wide[:, 10:58]
    assert not view.is_contiguous()
    extents = (Extent(100, 4), Extent(3, 5))
    copier.save([SaveJob(planned(extents), view)])
    drain(copier)
    assert region_bytes(region, extents) == as_bytes(view)


@pytest.mark.parametrize("runs", [1, 4, 5, 15, 16, 17], ids=lambda n: f"{n}runs")
def test_entries_near_the_inline_limit_round_trip(
    region: MemoryRegion, copier: TorchCopier, runs: int
) -> None:
    extents = tuple(Extent(500 - 7 * i, 1 + i % 3) for i in range(runs))
    src = payload(sum(e.length for e in extents), LAYOUT, copier.device, seed=runs)
    copier.save([SaveJob(planned(extents), src)])
    drain(copier)
    assert region_bytes(region, extents) == as_bytes(src)
    [out] = copier.load([planned(extents)])
    assert as_bytes(out) == as_bytes(src)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "layout",
    [
        Layout(hidden_dim=5, dtype="float32", num_blocks=20000),  # 20-byte rows: 4-byte words
        Layout(hidden_dim=33, dtype="float8_e4m3fn", num_blocks=20000),  # 33-byte rows: bytes
        Layout(hidden_dim=100, dtype="float16", num_blocks=5000),  # 200-byte rows: 8-byte words
        Layout(hidden_dim=1024, dtype="bfloat16", num_blocks=600),  # 2 KiB rows: 16-byte accesses
    ],
    ids=lambda lay: f"{lay.dtype}x{lay.hidden_dim}",
)
def test_other_dtypes_and_widths_round_trip(layout: Layout, device: str) -> None:
    region = MemoryRegion(layout, name="widths")
    copier = TorchCopier(region, device=device)
    try:
        entries = [scattered(rows, num_blocks=layout.num_blocks // 3, seed=rows) for rows in (1, 7, 40)]
        entries = [
            tuple(Extent(e.start + i * (layout.num_blocks // 3), e.length) for e in ext)
            for i, ext in enumerate(entries)
        ]
        round_trip(copier, region, entries, payloads(entries, layout, device))
    finally:
        copier.close()
        region.close()


def test_an_unknown_device_is_refused(region: MemoryRegion) -> None:
    with pytest.raises(ValueError, match="'meta' is not supported"):
        TorchCopier(region, device="meta")


def test_a_closed_copier_refuses_new_copies(copier: TorchCopier) -> None:
    copier.close()
    with pytest.raises(RegionError, match="closed"):
        copier.save([SaveJob(planned((Extent(0, 1),)), payload(1, LAYOUT, copier.device))])
    with pytest.raises(RegionError, match="closed"):
        copier.load([planned((Extent(0, 1),))])


def test_timings_describe_each_finished_batch(copier: TorchCopier) -> None:
    save = planned((Extent(0, 10), Extent(20, 6)))
    copier.save([SaveJob(save, payload(16, LAYOUT, copier.device))])
    load = planned((Extent(0, 10),))
    copier.load([load])
    drain(copier)
    timings = copier.drain_timings()
    assert [(t.direction, t.tickets, t.nbytes) for t in timings] == [
        ("save", (save.ticket,), 16 * LAYOUT.block_size_bytes),
        ("load", (load.ticket,), 10 * LAYOUT.block_size_bytes),
    ]
    assert all(t.seconds >= 0 for t in timings)
    assert copier.drain_timings() == []


@pytest.mark.parametrize("device", DEVICES)
def test_a_closed_copier_lets_the_shm_region_unmap_at_once(device: str) -> None:
    # on /dev/shm: CUDA refuses to register MAP_SHARED mappings of some other file systems
    shm = pytest.importorskip("ec_connector.adapters.shm")
    structlog = pytest.importorskip("structlog")
    directory = Path("/dev/shm") / f"ec_copier_test_{uuid.uuid4().hex[:12]}"
    directory.mkdir(mode=0o700)
    try:
        region = shm.ShmRegion.open(instance="copier-unmap", dp_rank=0, layout=LAYOUT, shm_dir=directory)
        copier = TorchCopier(region, device=device)
        copier.save([SaveJob(planned((Extent(0, 3),)), payload(3, LAYOUT, device))])
        copier.load([planned((Extent(0, 3),))])
        copier.close()
        with structlog.testing.capture_logs() as logs:
            region.close()
        assert [e for e in logs if e["event"] == "region_unmap_deferred"] == []
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- CUDA only ---------------------------------------------------------------------------------


@CUDA
def test_poll_does_not_wait_for_a_busy_gpu(region: MemoryRegion) -> None:
    copier = TorchCopier(region, device="cuda")
    try:
        src = payload(8, LAYOUT, "cuda")  # made first: a pageable upload would wait for the sleep
        torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time queued before the copy
        save = planned((Extent(0, 8),))
        copier.save([SaveJob(save, src)])
        t0 = time.perf_counter()
        assert copier.poll() == []
        assert time.perf_counter() - t0 < 0.05
        assert copier.in_flight() == 1
        torch.cuda.synchronize()
        assert drain(copier) == [save.ticket]
    finally:
        copier.close()


@CUDA
def test_sources_stay_alive_until_their_copy_ends(region: MemoryRegion) -> None:
    copier = TorchCopier(region, device="cuda")
    try:
        extents = (Extent(0, 64),)
        src = payload(64, LAYOUT, "cuda", seed=7)
        expected = as_bytes(src)
        torch.cuda._sleep(500_000_000)  # the copy cannot start before the caller's queued work
        copier.save([SaveJob(planned(extents), src)])
        del src
        for _ in range(8):  # would reuse the freed block if the copier had not kept it
            torch.empty(64, LAYOUT.hidden_dim, dtype=torch.bfloat16, device="cuda").fill_(-1.0)
        torch.cuda.synchronize()
        drain(copier)
        assert region_bytes(region, extents) == expected
    finally:
        copier.close()


@CUDA
def test_a_load_on_a_side_stream_orders_that_stream(region: MemoryRegion) -> None:
    copier = TorchCopier(region, device="cuda")
    try:
        extents = (Extent(30, 12), Extent(2, 5))
        src = payload(17, LAYOUT, "cuda", seed=3)
        copier.save([SaveJob(planned(extents), src)])
        drain(copier)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)
            [out] = copier.load([planned(extents)])
            copy = out.clone()  # queued on `side` after the load: must see the bytes
        side.synchronize()
        assert as_bytes(copy) == as_bytes(src)
        drain(copier)
    finally:
        copier.close()


@CUDA
@pytest.mark.parametrize("direction", ["load", "save"])
def test_a_refused_batch_gives_its_events_back_and_the_next_one_runs(
    region: MemoryRegion, direction: str
) -> None:
    """A batch is planned and queued in one native call with events taken from the pool first; a
    batch refused there (extents beyond the region) must put them back and queue nothing."""
    copier = TorchCopier(region, device="cuda")  # no save launcher: the step thread queues saves
    try:
        good, beyond = (Extent(0, 64),), (Extent(LAYOUT.num_blocks - 8, 64),)
        src = payload(64, LAYOUT, "cuda", seed=11)
        copier.save([SaveJob(planned(good), src)])
        drain(copier)
        pool = copier._engine._events  # type: ignore[union-attr]  # white box: nothing else shows the pool
        pooled = len(pool)
        for _ in range(3):
            with pytest.raises(LayoutMismatch, match="beyond the region's 4096 blocks"):
                if direction == "load":
                    copier.load([planned(beyond)])
                else:
                    copier.save([SaveJob(planned(beyond), src)])
        assert len(pool) == pooled and copier.in_flight() == 0
        tail = (Extent(LAYOUT.num_blocks - 8, 8),)  # the part of `beyond` inside the region
        assert region_bytes(region, tail) == bytes(8 * LAYOUT.block_size_bytes), "nothing written"
        [again] = copier.load([planned(good)])
        drain(copier)
        assert as_bytes(again) == as_bytes(src)
    finally:
        copier.close()


@CUDA
def test_misaligned_payloads_round_trip(region: MemoryRegion) -> None:
    copier = TorchCopier(region, device="cuda")
    try:
        flat = payload(40, LAYOUT, "cuda", seed=5).view(-1)
        odd = flat[1 : 1 + 7 * LAYOUT.hidden_dim].view(7, LAYOUT.hidden_dim)  # 2-byte aligned
        even = payload(9, LAYOUT, "cuda", seed=6)
        a, b = (Extent(900, 3), Extent(10, 4)), (Extent(50, 9),)
        copier.save([SaveJob(planned(a), odd), SaveJob(planned(b), even)])
        drain(copier)
        assert region_bytes(region, a) == as_bytes(odd)
        assert region_bytes(region, b) == as_bytes(even)
    finally:
        copier.close()


@CUDA
def test_copiers_share_one_registration_and_the_last_close_releases_it(region: MemoryRegion) -> None:
    from ec_connector.adapters.torch_copy import hostmem

    first = TorchCopier(region, device="cuda")
    second = TorchCopier(region, device="cuda")
    first.close()
    extents = (Extent(7, 20),)
    src = payload(20, LAYOUT, "cuda", seed=11)
    second.save([SaveJob(planned(extents), src)])
    drain(second)
    assert region_bytes(region, extents) == as_bytes(src)
    second.close()
    address = torch.frombuffer(region.data(), dtype=torch.uint8).data_ptr()
    fresh = hostmem.HostRegistration(address, LAYOUT.data_bytes, torch.device("cuda", 0), name="check")
    try:
        assert fresh.owned, "the copiers left the region registered"
    finally:
        fresh.close()


@CUDA
def test_a_large_scattered_batch_round_trips() -> None:
    layout = Layout(hidden_dim=1024, dtype="bfloat16", num_blocks=16384)  # 32 MiB
    region = MemoryRegion(layout, name="large")
    copier = TorchCopier(region, device="cuda")
    try:
        rng = random.Random(1)
        blocks = list(range(layout.num_blocks))
        rng.shuffle(blocks)
        entries, pos = [], 0
        for _ in range(32):
            rows = rng.randint(1, 300)
            entries.append(tuple(Extent(b, 1) for b in blocks[pos : pos + rows]))
            pos += rows
        sources = [payload(len(ext), layout, "cuda", seed=i) for i, ext in enumerate(entries)]
        copier.save([SaveJob(planned(ext), src) for ext, src in zip(entries, sources, strict=True)])
        drain(copier)
        for ext, src in zip(entries, sources, strict=True):
            assert region_bytes(region, ext) == as_bytes(src)
        out = copier.load([planned(ext) for ext in reversed(entries)])
        assert [as_bytes(o) for o in out] == [as_bytes(s) for s in reversed(sources)]
        drain(copier)
    finally:
        copier.close()
        region.close()


@CUDA
@pytest.mark.parametrize("dma_min_rows", [1, 2], ids=["dma-only", "split"])
def test_more_copy_engine_runs_than_one_driver_call_takes_round_trip(dma_min_rows: int) -> None:
    """Thousands of short copy-engine runs in one batch: cut into driver calls of BATCH_MAX (one
    call of ~8,700 crashed driver 580.159), in order, beside the kernel's runs when split."""
    layout = Layout(hidden_dim=1024, dtype="bfloat16", num_blocks=16384)  # 2 KiB rows, 32 MiB
    region = MemoryRegion(layout, name="many-runs")
    copier = TorchCopier(region, device="cuda", dma_min_bytes=dma_min_rows * layout.block_size_bytes)
    try:
        rng = random.Random(dma_min_rows)
        starts = list(range(0, layout.num_blocks, 3))  # runs of 1-2 rows never touch
        rng.shuffle(starts)
        entries = [
            tuple(Extent(starts.pop(), rng.randint(1, 2)) for _ in range(rng.randint(100, 150)))
            for _ in range(32)
        ]
        assert sum(map(len, entries)) > 12 * BATCH_MAX
        round_trip(copier, region, entries, payloads(entries, layout, "cuda"))
    finally:
        copier.close()
        region.close()


@CUDA
@pytest.mark.parametrize("dma_min_rows", [None, 1, 4], ids=["kernel-only", "dma-only", "split"])
def test_runs_split_between_copy_engines_and_kernel_round_trip(
    region: MemoryRegion, dma_min_rows: int | None
) -> None:
    """Long runs go to the copy engines, short ones to the kernel; any mix lands the same bytes."""
    rb = LAYOUT.block_size_bytes
    copier = TorchCopier(
        region, device="cuda", dma_min_bytes=None if dma_min_rows is None else dma_min_rows * rb
    )
    try:
        rng = random.Random(dma_min_rows)
        blocks = list(range(0, LAYOUT.num_blocks, 10))
        rng.shuffle(blocks)
        entries = []
        for _ in range(6):
            runs = [Extent(blocks.pop(), rng.randint(1, 8)) for _ in range(rng.randint(1, 6))]
            entries.append(tuple(runs))
        flat = payload(400, LAYOUT, "cuda", seed=9).view(-1)
        sources, pos = [], 1  # the first source starts 2 bytes in: a misaligned batch
        for ext in entries:
            rows = sum(e.length for e in ext)
            sources.append(flat[pos : pos + rows * LAYOUT.hidden_dim].view(rows, LAYOUT.hidden_dim))
            pos += rows * LAYOUT.hidden_dim + 8
        for batch in (sources, payloads(entries, LAYOUT, "cuda")):
            round_trip(copier, region, entries, batch)
            [single] = copier.load([planned(entries[0])])
            assert as_bytes(single) == as_bytes(batch[0])
            drain(copier)
    finally:
        copier.close()


# -- the save launcher (saves wholly on the copy engines, queued by a native thread) ----------------


@CUDA
@pytest.mark.parametrize("launcher", [True, False], ids=["launcher", "step-thread"])
def test_a_save_waits_for_the_callers_queued_writes_to_its_payload(
    region: MemoryRegion, launcher: bool
) -> None:
    """The payload is written on the caller's stream behind ~0.5 s of queued work when `save` is
    called: the copy (queued by the launcher's thread, or by this one) must see the written bytes."""
    copier = TorchCopier(region, device="cuda", save_launcher=launcher)
    try:
        extents = (Extent(100, 64), Extent(3000, 64))  # two long runs: copy engines only
        wanted = payload(128, LAYOUT, "cuda", seed=21)
        src = torch.zeros_like(wanted)
        torch.cuda._sleep(500_000_000)
        src.copy_(wanted)  # queued behind the sleep: not yet written when save() returns
        copier.save([SaveJob(planned(extents), src)])
        assert copier.poll() == []
        drain(copier)
        assert region_bytes(region, extents) == as_bytes(wanted)
    finally:
        copier.close()


@CUDA
def test_launched_saves_kernel_saves_and_loads_interleave_with_the_right_bytes(region: MemoryRegion) -> None:
    """Copy-engine saves go through the launcher's thread, saves with short runs through the kernel on
    this thread; batches of both, and loads of what has landed, in any order, each report once."""
    copier = TorchCopier(region, device="cuda", dma_min_bytes=8 * LAYOUT.block_size_bytes, save_launcher=True)
    rng = random.Random(5)
    free = list(range(0, LAYOUT.num_blocks - 16, 16))
    rng.shuffle(free)
    landed: list[tuple[tuple[Extent, ...], torch.Tensor]] = []
    try:
        for round_ in range(12):
            batch = [(Extent(free.pop(), 16),) for _ in range(3)]  # long runs: copy engines
            if round_ % 2 == 0:  # and an entry in 20 short runs: the kernel, on this thread
                batch.append(tuple(Extent(free.pop(), 1) for _ in range(20)))
            sources = payloads(batch, LAYOUT, "cuda")
            sources = [s.roll(round_, 0) for s in sources]
            saves = [planned(ext) for ext in batch]
            copier.save([SaveJob(c, s) for c, s in zip(saves, sources, strict=True)])
            if landed:
                ext, src = landed[rng.randrange(len(landed))]
                loads = [planned(ext)]
                [out] = copier.load(loads)
                assert as_bytes(out) == as_bytes(src)
            seen = drain(copier)
            assert sorted(seen) == sorted([c.ticket for c in saves] + ([loads[0].ticket] if landed else []))
            landed += zip(batch, sources, strict=True)
        for ext, src in landed:
            assert region_bytes(region, ext) == as_bytes(src)
    finally:
        copier.close()


@CUDA
def test_close_waits_for_saves_the_launcher_has_not_queued_yet(region: MemoryRegion) -> None:
    """Close right after a burst of launched saves: every one lands before the registration goes."""
    copier = TorchCopier(region, device="cuda", save_launcher=True)
    entries = [(Extent(64 * i, 48),) for i in range(60)]
    sources = payloads(entries, LAYOUT, "cuda")
    for ext, src in zip(entries, sources, strict=True):
        copier.save([SaveJob(planned(ext), src)])
    copier.close()
    assert len(copier.poll()) == len(entries), "every ticket is reported once, after close"
    for ext, src in zip(entries, sources, strict=True):
        assert region_bytes(region, ext) == as_bytes(src)
