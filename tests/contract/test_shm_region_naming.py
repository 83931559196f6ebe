"""The /dev/shm region adapter's file: its name, mode and size, the header's share, and bad instance
names, ranks and counts refused without touching any file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ec_connector.adapters.shm import BadRegionName, ShmRegion, region_file_name
from ec_connector.domain.errors import RegionError
from tests.contract.shm_region_helpers import LAYOUT, dir_snapshot, instance_name, open_region


def test_region_file_is_dev_shm_vllm_ec_instance_dp_rank_mmap_mode_0600() -> None:
    instance = instance_name()
    with ShmRegion.open(instance=instance, dp_rank=3, layout=LAYOUT, participants=2) as region:
        path = Path(f"/dev/shm/vllm_ec_{instance}_dp3.mmap")
        assert region.path == path and region.name == path.name
        st = os.stat(path)
        assert oct(st.st_mode & 0o777) == oct(0o600) and st.st_uid == os.getuid()
        assert st.st_size == region.geometry.file_size == region.geometry.data_offset + LAYOUT.data_bytes
        assert region.geometry.data_offset % 4096 == 0
        assert not list(Path("/dev/shm").glob(f".vllm_ec_{instance}*")), "staging file left"
    assert not path.exists()


def test_header_is_accounted_openly() -> None:
    with ShmRegion.open(instance=instance_name(), dp_rank=0, layout=LAYOUT, ranks=1) as one:
        assert one.geometry.data_offset == 40 * 1024
    with ShmRegion.open(instance=instance_name(), dp_rank=0, layout=LAYOUT, ranks=8) as eight:
        assert eight.geometry.data_offset == 264 * 1024


BAD_INSTANCES = [
    "",
    ".",
    "..",
    ".hidden",
    "a/b",
    "../x",
    "/abs",
    "a\\b",
    "a b",
    "a\0b",
    "é",
    "x" * 101,
    None,
    7,
]


@pytest.mark.parametrize("instance", BAD_INSTANCES)
def test_bad_instance_names_are_refused_and_touch_nothing(instance: object, shm_dir: Path) -> None:
    sentinel = shm_dir / "vllm_ec_keep_dp0.mmap"
    with open_region("keep", shm_dir, participants=2):
        (shm_dir / "other.bin").write_bytes(b"x" * 10)
        before = dir_snapshot(shm_dir)
        with pytest.raises(BadRegionName) as info:
            ShmRegion.open(instance=instance, dp_rank=0, layout=LAYOUT, shm_dir=shm_dir)  # type: ignore[arg-type]
        assert repr(instance)[:40] in str(info.value) and "[A-Za-z0-9._-]" in str(info.value)
        assert isinstance(info.value, ValueError) and isinstance(info.value, RegionError)
        assert dir_snapshot(shm_dir) == before
        assert sentinel.exists()
    (shm_dir / "other.bin").unlink()


def test_instance_names_at_the_edges_of_the_accepted_form_work(shm_dir: Path) -> None:
    for instance in ["a", "x" * 100, "engine-0.producer_A", "0", "_x", "-x", "a..b"]:
        with open_region(instance, shm_dir) as region:
            assert region.name == f"vllm_ec_{instance}_dp0.mmap"


@pytest.mark.parametrize("dp_rank", [-1, True, "0", 1.5, None])
def test_bad_dp_ranks_are_refused(dp_rank: object) -> None:
    with pytest.raises(BadRegionName, match="dp_rank .*expected an integer >= 0"):
        region_file_name("ok", dp_rank)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"participants": 2, "slot": 2}, "slot 2 is outside 0..1"),
        ({"slot": -1}, "slot -1"),
        ({"participants": 0}, "participants 0"),
        ({"participants": 257}, "participants 257"),
        ({"ranks": 0}, "ranks 0"),
        ({"ring_slots": 0}, "ring_slots 0"),
    ],
)
def test_bad_counts_are_refused_before_any_file_exists(kw: dict[str, int], match: str, shm_dir: Path) -> None:
    with pytest.raises(ValueError, match=match):
        open_region(instance_name(), shm_dir, **kw)
