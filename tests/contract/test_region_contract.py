"""The Region port's contract, one set of test bodies run against every adapter.

`region_factory` yields a function that makes regions of the adapter under test (closing them
at teardown); reuse it from other contract suites by importing the fixtures from this module.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ec_connector.adapters.memory import MemoryRegion
from ec_connector.adapters.shm import REGION_GLOB, ShmRegion
from ec_connector.domain.errors import RegionError
from ec_connector.domain.layout import Layout
from ec_connector.domain.transfers import Completion
from ec_connector.ports.region import Region

LAYOUT = Layout(hidden_dim=48, dtype="bfloat16", num_blocks=37)
RANKS = 3

RegionFactory = Callable[..., Region]


@pytest.fixture(params=["memory", "shm"])
def region_factory(request: pytest.FixtureRequest, shm_dir: Path) -> Iterator[RegionFactory]:
    made: list[Region] = []

    def make(layout: Layout = LAYOUT) -> Region:
        region: Region
        if request.param == "memory":
            region = MemoryRegion(layout, name=f"memory-{len(made)}", ranks=RANKS)
        else:
            region = ShmRegion.open(
                instance=f"contract-{uuid.uuid4().hex[:8]}",
                dp_rank=0,
                layout=layout,
                ranks=RANKS,
                shm_dir=shm_dir,
            )
        made.append(region)
        return region

    yield make
    for region in made:
        region.close()
    assert list(shm_dir.glob(REGION_GLOB)) == []


@pytest.fixture
def region(region_factory: RegionFactory) -> Region:
    return region_factory()


def test_region_reports_its_name_and_layout(region: Region) -> None:
    assert region.layout == LAYOUT
    assert isinstance(region.name, str) and region.name


def test_data_is_exactly_the_layout_bytes_and_writable(region: Region) -> None:
    view = region.data()
    assert view.nbytes == len(view) == LAYOUT.data_bytes
    assert not view.readonly
    pattern = bytes(range(256)) * (LAYOUT.data_bytes // 256) + bytes(LAYOUT.data_bytes % 256)
    view[:] = pattern
    view.release()
    again = region.data()
    assert bytes(again) == pattern
    again.release()


def test_writes_to_one_block_leave_the_others_alone(region: Region) -> None:
    b = LAYOUT.block_size_bytes
    view = region.data()
    view[:] = bytes(LAYOUT.data_bytes)
    view[5 * b : 6 * b] = b"\xab" * b
    assert bytes(view[4 * b : 5 * b]) == bytes(b)
    assert bytes(view[5 * b : 6 * b]) == b"\xab" * b
    assert bytes(view[6 * b : 7 * b]) == bytes(b)
    view.release()


def test_completions_are_drained_once_in_posting_order_per_rank(region: Region) -> None:
    posted = [
        Completion(0, 1),
        Completion(2, 10),
        Completion(0, 2),
        Completion(1, 5),
        Completion(0, 3),
        Completion(2, 11),
    ]
    for c in posted:
        assert region.post_completions(c.rank, [c.ticket]) == 1
    drained = region.drain_completions()

    def key(c: Completion) -> tuple[int, int]:
        return c.rank, c.ticket

    assert sorted(drained, key=key) == sorted(posted, key=key)
    for rank in range(RANKS):
        assert [c for c in drained if c.rank == rank] == [c for c in posted if c.rank == rank]
    assert region.drain_completions() == []


def test_failure_flag_and_largest_ticket_survive_the_round_trip(region: Region) -> None:
    region.post_completions(1, [7], ok=False)
    region.post_completions(1, [2**62 - 1], ok=True)
    region.post_completions(0, [2**62 - 1], ok=False)
    drained = region.drain_completions()
    assert [c for c in drained if c.rank == 1] == [
        Completion(1, 7, ok=False),
        Completion(1, 2**62 - 1, ok=True),
    ]
    assert [c for c in drained if c.rank == 0] == [Completion(0, 2**62 - 1, ok=False)]


def test_many_completions_drained_in_rounds_each_once(region: Region) -> None:
    expected: list[Completion] = []
    got: list[Completion] = []
    ticket = 1
    for _ in range(4):  # 4 × 1500 posts on rank 0 wraps a 4096-slot ring
        for _ in range(1500):
            c = Completion(0, ticket, ok=ticket % 7 != 0)
            region.post_completions(0, [ticket], ok=c.ok)
            expected.append(c)
            ticket += 1
        got.extend(region.drain_completions())
    assert got == expected


def test_close_is_idempotent(region: Region) -> None:
    region.close()
    region.close()


def test_closed_region_refuses_data_and_posts_and_drains_nothing(region: Region) -> None:
    region.post_completions(0, [1])
    region.close()
    with pytest.raises(RegionError):
        region.data()
    with pytest.raises(RegionError):
        region.post_completions(0, [2])
    assert region.drain_completions() == []


def test_regions_made_by_the_factory_are_independent(region_factory: RegionFactory) -> None:
    a, b = region_factory(), region_factory()
    va, vb = a.data(), b.data()
    va[:4] = b"AAAA"
    vb[:4] = b"BBBB"
    assert bytes(va[:4]) == b"AAAA"
    va.release()
    vb.release()
    a.post_completions(0, [1])
    assert b.drain_completions() == []
    assert a.drain_completions() == [Completion(0, 1)]


@pytest.mark.parametrize("rank, ticket", [(-1, 1), (RANKS, 1), (0, 0), (0, 1 << 62), (0, True), (0, 2.0)])
def test_completion_with_bad_rank_or_ticket_is_rejected(region_factory, rank, ticket):
    region = region_factory()
    with pytest.raises(ValueError, match="rank|ticket"):
        region.post_completions(rank, [ticket])
    assert region.drain_completions() == []


def test_a_batch_of_completions_is_recorded_in_order_with_its_outcome(region: Region) -> None:
    assert region.post_completions(1, [4, 2, 9]) == 3
    assert region.post_completions(1, [3], ok=False) == 1
    assert region.post_completions(0, []) == 0
    assert region.drain_completions() == [
        Completion(1, 4),
        Completion(1, 2),
        Completion(1, 9),
        Completion(1, 3, ok=False),
    ]


def test_one_bad_ticket_in_a_batch_records_none_of_it(region: Region) -> None:
    with pytest.raises(ValueError, match=f"ticket {2**62} is outside"):
        region.post_completions(0, [1, 2, 2**62, 3])
    assert region.drain_completions() == []
