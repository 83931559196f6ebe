"""The /dev/shm region adapter's completion rings (back pressure, wrap-around, bad input refused by
name) and its data area (the address this process maps it at, views kept past close)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from ec_connector.domain.errors import RegionError
from ec_connector.domain.transfers import Completion
from tests.contract.shm_region_helpers import LAYOUT, instance_name, open_region

# -- completions: bad input and back pressure -------------------------------------------------


def test_a_full_ring_records_what_fits_and_never_overwrites(shm_dir: Path) -> None:
    with open_region(instance_name(), shm_dir, ranks=2, ring_slots=8) as region:
        assert region.post_completions(1, [n + 1 for n in range(6)]) == 6
        assert region.post_completions(1, [7, 8, 9, 10], ok=False) == 2  # the first two fit
        assert region.post_completions(1, [99]) == 0
        assert region.post_completions(0, [5]) == 1  # other ranks are unaffected
        assert region.drain_completions() == [Completion(0, 5)] + [Completion(1, n + 1) for n in range(6)] + [
            Completion(1, 7, ok=False),
            Completion(1, 8, ok=False),
        ]
        assert region.post_completions(1, [9, 10, 100], ok=False) == 3  # the rest, after the drain
        assert region.drain_completions() == [Completion(1, t, ok=False) for t in (9, 10, 100)]


def test_batches_that_wrap_around_the_ring_drain_in_order(shm_dir: Path) -> None:
    with open_region(instance_name(), shm_dir, ranks=1, ring_slots=8) as region:
        ticket = 1
        for size in (6, 5, 8, 3, 7):  # every batch after the first starts where the last ended
            tickets = list(range(ticket, ticket + size))
            assert region.post_completions(0, tickets, ok=size % 2 == 0) == size
            assert region.drain_completions() == [Completion(0, t, ok=size % 2 == 0) for t in tickets]
            ticket += size


@pytest.mark.parametrize(
    ("completion", "match"),
    [
        (Completion(2, 1), "rank 2 is outside 0..1"),
        (Completion(-1, 1), "rank -1"),
        (Completion(0, 2**62), f"ticket {2**62} is outside"),
        (Completion(0, -1), "ticket -1"),
    ],
)
def test_bad_rank_or_ticket_is_refused_by_name(completion: Completion, match: str, shm_dir: Path) -> None:
    with open_region(instance_name(), shm_dir, ranks=2) as region:
        with pytest.raises(ValueError, match=match):
            region.post_completions(completion.rank, [1, completion.ticket])
        assert region.drain_completions() == []


# -- data area --------------------------------------------------------------------------------


def test_data_address_is_this_processes_address_of_the_data_area(shm_dir: Path) -> None:
    with open_region(instance_name(), shm_dir, populate=True) as region:
        view = region.data()
        view[:6] = b"region"
        assert ctypes.string_at(region.data_address(), 6) == b"region"
        ctypes.memmove(region.data_address() + LAYOUT.data_bytes - 3, b"end", 3)
        assert bytes(view[-3:]) == b"end"
        view.release()
    with pytest.raises(RegionError):
        region.data_address()


def test_a_view_kept_past_close_stays_readable_and_close_does_not_raise(shm_dir: Path) -> None:
    region = open_region(instance_name(), shm_dir)
    view = region.data()
    view[:3] = b"abc"
    region.close()
    with pytest.raises(RegionError):
        region.data()
    assert bytes(view[:3]) == b"abc"  # still mapped until the last view goes
    view.release()
