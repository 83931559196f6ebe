"""The Copier port's contract: one set of test bodies run against every implementation.

Each leg is a `Kit`: how to build the region and the copier, how to make a payload of R rows from
a seed, and how to turn a payload back into bytes. Legs: the in-memory fake (`HostPayload`s), and
`TorchCopier` on CPU and on CUDA (skipped without a GPU), each over `MemoryRegion` and over the
real /dev/shm `ShmRegion`, and once more on CUDA with the copy kernel doing every run.
"""

from __future__ import annotations

import itertools
import random
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ec_connector.adapters.memory import HostPayload, MemoryCopier, MemoryRegion
from ec_connector.adapters.torch_copy import TorchCopier
from ec_connector.domain.blocks import Extent
from ec_connector.domain.errors import LayoutMismatch
from ec_connector.domain.layout import DTYPE_ITEMSIZE, Layout
from ec_connector.domain.transfers import PlannedCopy, SaveJob
from ec_connector.ports.copier import Copier
from ec_connector.ports.region import Region

LAYOUT = Layout(hidden_dim=48, dtype="bfloat16", num_blocks=4096)
NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
_tickets = itertools.count(1)


# -- the kits ----------------------------------------------------------------------------------


def _random_bytes(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _host_payload(rows: int, seed: int, dtype: str, width: int) -> object:
    return HostPayload(dtype, rows, width, _random_bytes(rows * width * DTYPE_ITEMSIZE[dtype], seed))


def _host_bytes(payload: object) -> bytes:
    assert isinstance(payload, HostPayload)
    return payload.data


def _tensor_maker(device: str) -> Callable[[int, int, str, int], object]:
    def make(rows: int, seed: int, dtype: str, width: int) -> object:
        raw = bytearray(_random_bytes(rows * width * DTYPE_ITEMSIZE[dtype], seed))
        flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        return flat.view(getattr(torch, dtype)).view(rows, width).to(device)

    return make


def _tensor_bytes(payload: object) -> bytes:
    assert isinstance(payload, torch.Tensor)
    return payload.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()


@dataclass(frozen=True)
class Kit:
    name: str
    region_kind: str  # "memory" or "shm"
    build: Callable[[Region], Copier]
    make: Callable[[int, int, str, int], object]
    to_bytes: Callable[[object], bytes]

    def payload(self, rows: int, seed: int, *, dtype: str | None = None, width: int | None = None) -> object:
        return self.make(rows, seed, dtype or LAYOUT.dtype, width or LAYOUT.hidden_dim)


def _torch_kit(device: str, region_kind: str, **options: object) -> Kit:
    name = f"torch-{device}" + ("-shm" if region_kind == "shm" else "") + ("-launcher" if options else "")
    return Kit(
        name,
        region_kind,
        lambda r: TorchCopier(r, device=device, **options),  # type: ignore[arg-type]
        _tensor_maker(device),
        _tensor_bytes,
    )


KITS = [
    pytest.param(Kit("memory", "memory", MemoryCopier, _host_payload, _host_bytes), id="memory"),
    pytest.param(_torch_kit("cpu", "memory"), id="torch-cpu"),
    pytest.param(_torch_kit("cpu", "shm"), id="torch-cpu-shm"),
    pytest.param(_torch_kit("cuda", "memory"), id="torch-cuda", marks=NO_CUDA),
    pytest.param(_torch_kit("cuda", "shm"), id="torch-cuda-shm", marks=NO_CUDA),
    # copy-engine saves queued on the driver by the save launcher's native thread
    pytest.param(_torch_kit("cuda", "shm", save_launcher=True), id="torch-cuda-launcher", marks=NO_CUDA),
    # every run through the copy kernel (by default small batches go to the copy engines)
    pytest.param(_torch_kit("cuda", "memory", dma_min_bytes=None), id="torch-cuda-kernel", marks=NO_CUDA),
]


@pytest.fixture(params=KITS)
def kit(request: pytest.FixtureRequest) -> Kit:
    return request.param


@pytest.fixture
def region(kit: Kit) -> Iterator[Region]:
    if kit.region_kind == "memory":
        made: Region = MemoryRegion(LAYOUT, name="copier-contract")
        yield made
        made.close()
        return
    shm = pytest.importorskip("ec_connector.adapters.shm")
    directory = Path("/dev/shm") / f"ec_copier_test_{uuid.uuid4().hex[:12]}"
    directory.mkdir(mode=0o700)
    try:
        made = shm.ShmRegion.open(
            instance=f"copier-{uuid.uuid4().hex[:8]}", dp_rank=0, layout=LAYOUT, shm_dir=directory
        )
        yield made
        made.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def copier(kit: Kit, region: Region) -> Iterator[Copier]:
    made = kit.build(region)
    yield made
    made.close()


# -- helpers -----------------------------------------------------------------------------------


def planned(extents: tuple[Extent, ...], *, rows: int | None = None, key: str = "item") -> PlannedCopy:
    covered = sum(e.length for e in extents)
    return PlannedCopy(next(_tickets), key, extents, covered if rows is None else rows)


def drain(copier: Copier, timeout_s: float = 20.0) -> list[int]:
    """Poll until nothing is in flight; every ticket returned along the way, in order."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout_s
    while True:
        seen += copier.poll()
        if copier.in_flight() == 0:
            return seen
        assert time.monotonic() < deadline, f"copies still in flight after {timeout_s}s"
        time.sleep(0.001)


def region_bytes(region: Region, extents: tuple[Extent, ...]) -> bytes:
    b = region.layout.block_size_bytes
    view = region.data()
    return b"".join(bytes(view[e.start * b : e.end * b]) for e in extents)


def fragmented(rows: int, *, first: int = 7) -> tuple[Extent, ...]:
    """`rows` blocks as runs of 1, 2, 3, ... blocks with gaps between them, last run first."""
    runs: list[Extent] = []
    start, size, left = first, 1, rows
    while left:
        n = min(size, left)
        runs.append(Extent(start, n))
        start += n + 3 + size % 5
        size, left = size + 1, left - n
    return tuple(reversed(runs))


def fill_region(region: Region, seed: int) -> bytes:
    view = region.data()
    data = _random_bytes(len(view), seed)
    view[:] = data
    return data


# -- the contract ------------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 3, 17, 130])
@pytest.mark.parametrize("shape", ["contiguous", "fragmented"])
def test_save_then_load_round_trips_the_bytes(
    kit: Kit, region: Region, copier: Copier, shape: str, rows: int
) -> None:
    fill_region(region, seed=rows)
    extents = (Extent(11, rows),) if shape == "contiguous" else fragmented(rows)
    save = planned(extents)
    payload = kit.payload(rows, seed=100 + rows)
    copier.save([SaveJob(save, payload)])
    assert drain(copier) == [save.ticket]
    assert region_bytes(region, extents) == kit.to_bytes(payload)

    load = planned(extents)
    [loaded] = copier.load([load])
    # work queued after load (here: reading the buffer back) sees the bytes, before any poll
    assert kit.to_bytes(loaded) == kit.to_bytes(payload)
    assert drain(copier) == [load.ticket]


def test_a_batch_of_several_entries_round_trips_in_order(kit: Kit, region: Region, copier: Copier) -> None:
    layouts = [(Extent(0, 5),), fragmented(9, first=40), (Extent(200, 1),), fragmented(33, first=400)]
    saves = [planned(e, key=f"item-{i}") for i, e in enumerate(layouts)]
    payloads = [kit.payload(c.rows, seed=i) for i, c in enumerate(saves)]
    copier.save([SaveJob(c, p) for c, p in zip(saves, payloads, strict=True)])
    assert sorted(drain(copier)) == sorted(c.ticket for c in saves)
    for extents, payload in zip(layouts, payloads, strict=True):
        assert region_bytes(region, extents) == kit.to_bytes(payload)

    loads = [planned(e, key=f"item-{i}") for i, e in enumerate(reversed(layouts))]
    out = copier.load(loads)
    assert [kit.to_bytes(p) for p in out] == [kit.to_bytes(p) for p in reversed(payloads)]
    assert sorted(drain(copier)) == sorted(c.ticket for c in loads)


def test_poll_returns_each_ticket_once_and_in_flight_reaches_zero(
    kit: Kit, region: Region, copier: Copier
) -> None:
    assert copier.in_flight() == 0 and copier.poll() == []
    a, b = planned((Extent(0, 4),)), planned((Extent(10, 2), Extent(20, 2)))
    copier.save([SaveJob(a, kit.payload(4, 1)), SaveJob(b, kit.payload(4, 2))])
    c = planned((Extent(0, 4),))
    copier.load([c])
    assert 0 <= copier.in_flight() <= 3
    seen = drain(copier)
    assert sorted(seen) == sorted([a.ticket, b.ticket, c.ticket])
    assert copier.in_flight() == 0
    assert copier.poll() == []


def test_empty_batches_do_nothing(kit: Kit, region: Region, copier: Copier) -> None:
    copier.save([])
    assert copier.load([]) == []
    assert copier.in_flight() == 0 and copier.poll() == []


@pytest.mark.parametrize("problem", ["dtype", "width", "rows", "type"])
def test_check_rejects_a_payload_that_does_not_fit(kit: Kit, copier: Copier, problem: str) -> None:
    copier.check(kit.payload(6, 1), 6)
    bad = {
        "dtype": lambda: kit.payload(6, 1, dtype="float32"),
        "width": lambda: kit.payload(6, 1, width=LAYOUT.hidden_dim + 1),
        "rows": lambda: kit.payload(5, 1),
        "type": lambda: b"\x00" * 6 * LAYOUT.block_size_bytes,
    }[problem]()
    with pytest.raises(LayoutMismatch):
        copier.check(bad, 6)


@pytest.mark.parametrize("problem", ["payload", "beyond_region", "miscounted"])
def test_a_save_batch_with_one_bad_job_writes_nothing(
    kit: Kit, region: Region, copier: Copier, problem: str
) -> None:
    before = fill_region(region, seed=5)
    good = SaveJob(planned((Extent(0, 8),)), kit.payload(8, 1))
    bad = {
        "payload": lambda: SaveJob(planned((Extent(20, 4),)), kit.payload(4, 2, dtype="float16")),
        "beyond_region": lambda: SaveJob(
            planned((Extent(20, 2), Extent(LAYOUT.num_blocks - 1, 2))), kit.payload(4, 2)
        ),
        "miscounted": lambda: SaveJob(planned((Extent(20, 3),), rows=4), kit.payload(4, 2)),
    }[problem]()
    with pytest.raises(LayoutMismatch):
        copier.save([good, bad])
    assert copier.in_flight() == 0 and copier.poll() == []
    assert bytes(region.data()) == before


@pytest.mark.parametrize("problem", ["beyond_region", "miscounted"])
def test_a_load_with_bad_extents_is_rejected(kit: Kit, copier: Copier, problem: str) -> None:
    bad = {
        "beyond_region": lambda: planned((Extent(LAYOUT.num_blocks, 1),)),
        "miscounted": lambda: planned((Extent(0, 3),), rows=2),
    }[problem]()
    with pytest.raises(LayoutMismatch):
        copier.load([planned((Extent(0, 2),)), bad])
    assert copier.in_flight() == 0 and copier.poll() == []


def test_close_waits_for_copies_and_is_idempotent(kit: Kit, region: Region, copier: Copier) -> None:
    """After close the bytes have landed and the next poll still reports the copy, once."""
    extents = fragmented(40)
    payload = kit.payload(40, 3)
    save = planned(extents)
    copier.save([SaveJob(save, payload)])
    copier.close()
    assert region_bytes(region, extents) == kit.to_bytes(payload)
    assert drain(copier) == [save.ticket]
    copier.close()
    assert copier.in_flight() == 0 and copier.poll() == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_disjoint_extents_round_trip(
    kit: Kit, region: Region, copier: Copier, data: st.DataObject
) -> None:
    """Entries cut from a shuffled set of disjoint runs save and load back byte for byte."""
    cuts = data.draw(st.lists(st.integers(1, 12), min_size=1, max_size=24), label="run lengths")
    gaps = data.draw(st.lists(st.integers(0, 5), min_size=len(cuts), max_size=len(cuts)), label="gaps")
    runs, pos = [], 0
    for n, gap in zip(cuts, gaps, strict=True):
        runs.append(Extent(pos + gap, n))
        pos += gap + n
    order = data.draw(st.permutations(runs), label="order")
    split = sorted(data.draw(st.sets(st.integers(1, max(1, len(order) - 1)), max_size=3), label="split"))
    groups = [tuple(order[a:b]) for a, b in itertools.pairwise([0, *split, len(order)]) if order[a:b]]
    saves = [planned(g, key=f"k{i}") for i, g in enumerate(groups)]
    payloads = [kit.payload(c.rows, seed=i) for i, c in enumerate(saves)]
    copier.save([SaveJob(c, p) for c, p in zip(saves, payloads, strict=True)])
    drain(copier)
    loads = [planned(g) for g in groups]
    out = copier.load(loads)
    assert [kit.to_bytes(p) for p in out] == [kit.to_bytes(p) for p in payloads]
    assert sorted(drain(copier)) == sorted(c.ticket for c in loads)


def test_entries_split_from_one_output_into_touching_extents_round_trip(
    kit: Kit, region: Region, copier: Copier
) -> None:
    """An encoder's batch output split per item, placed back to back: copiers may join such runs."""
    rows = [5, 7, 3, 9, 1, 6, 4, 8]
    whole = kit.payload(sum(rows), seed=77)
    if isinstance(whole, torch.Tensor):
        payloads: list[object] = list(whole.split(rows))  # views of one allocation
    else:
        raw, row_bytes, out = kit.to_bytes(whole), len(kit.to_bytes(whole)) // sum(rows), []
        for a, b in itertools.pairwise(itertools.accumulate(rows, initial=0)):
            out.append(
                HostPayload(LAYOUT.dtype, b - a, LAYOUT.hidden_dim, raw[a * row_bytes : b * row_bytes])
            )
        payloads = out
    extents, pos = [], 30
    for i, n in enumerate(rows):
        extents.append((Extent(pos, n),))
        pos += n + (3 if i == 4 else 0)  # one gap: two groups of touching runs
    saves = [planned(e, key=f"t{i}") for i, e in enumerate(extents)]
    copier.save([SaveJob(c, p) for c, p in zip(saves, payloads, strict=True)])
    assert sorted(drain(copier)) == sorted(c.ticket for c in saves)
    for e, p in zip(extents, payloads, strict=True):
        assert region_bytes(region, e) == kit.to_bytes(p)
    loads = [planned(e) for e in extents]
    out = copier.load(loads)
    assert [kit.to_bytes(p) for p in out] == [kit.to_bytes(p) for p in payloads]
    assert sorted(drain(copier)) == sorted(c.ticket for c in loads)
