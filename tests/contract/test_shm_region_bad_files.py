"""The /dev/shm region adapter refusing bad files and leaving them exactly as they were: another
layout, size, mode or owner, a taken slot, a file that is not a region, a symlink, a full tmpfs."""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ec_connector.adapters.shm import ShmRegion, reap_orphans, region_file_name, remove
from ec_connector.domain.errors import RegionError
from ec_connector.domain.layout import Layout
from tests.contract.shm_region_helpers import LAYOUT, instance_name, open_region, snapshot

ROOT = os.geteuid() == 0


# -- bad files: refused, left exactly as they were --------------------------------------------


@pytest.fixture
def held(shm_dir: Path) -> Iterator[ShmRegion]:
    """A region of 2 participants of which only this one has joined (so its file exists)."""
    region = open_region(instance_name(), shm_dir, participants=2, ranks=2)
    view = region.data()
    view[:8] = b"original"
    view.release()
    yield region
    region.close()


def _join_held(held: ShmRegion, **kw: object) -> ShmRegion:
    args: dict[str, object] = {"participants": 2, "ranks": 2, "slot": 1, **kw}
    return open_region(held.path.name[len("vllm_ec_") : -len("_dp0.mmap")], held.path.parent, **args)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"layout": Layout(hidden_dim=65, dtype="float16", num_blocks=96)}, "hidden_dim"),
        ({"layout": Layout(hidden_dim=64, dtype="bfloat16", num_blocks=96)}, "dtype"),
        ({"layout": Layout(hidden_dim=64, dtype="float16", num_blocks=95)}, "num_blocks"),
        ({"ranks": 3}, "ranks"),
        ({"participants": 3}, "participants"),
        ({"ring_slots": 1024}, "ring_slots"),
    ],
)
def test_a_joiner_with_another_layout_is_refused_naming_the_field(
    held: ShmRegion, kw: dict[str, object], field: str
) -> None:
    before = snapshot(held.path)
    with pytest.raises(RegionError, match=rf"{held.path}.*{field}: file has"):
        _join_held(held, **kw)
    assert snapshot(held.path) == before


def test_a_file_of_the_wrong_size_is_refused(held: ShmRegion) -> None:
    os.truncate(held.path, held.geometry.file_size + 4096)
    before = snapshot(held.path)
    with pytest.raises(RegionError, match=rf"size: file has {held.geometry.file_size + 4096} bytes"):
        _join_held(held)
    assert snapshot(held.path) == before


def test_a_file_with_another_mode_is_refused(held: ShmRegion) -> None:
    os.chmod(held.path, 0o644)
    before = snapshot(held.path)
    with pytest.raises(RegionError, match="mode 0o644, expected 0o600"):
        _join_held(held)
    assert snapshot(held.path) == before


def test_a_slot_already_taken_is_refused(held: ShmRegion) -> None:
    before = snapshot(held.path)
    with pytest.raises(RegionError, match=f"slot 0 .* already joined by pid {os.getpid()}"):
        _join_held(held, slot=0)
    assert snapshot(held.path) == before
    with _join_held(held) as second:  # the right slot still joins, and completes the set
        assert second.removed_name


@pytest.mark.skipif(not ROOT, reason="chown to another uid needs root")
def test_a_file_owned_by_another_user_is_refused_and_never_reaped(held: ShmRegion, shm_dir: Path) -> None:
    os.chown(held.path, 65534, 65534)
    before = snapshot(held.path)
    with pytest.raises(RegionError, match="owned by uid 65534"):
        _join_held(held)
    assert snapshot(held.path) == before
    foreign = shm_dir / "vllm_ec_foreign_dp0.mmap"
    foreign.write_bytes(os.urandom(8192))
    os.chmod(foreign, 0o600)
    os.chown(foreign, 65534, 65534)
    before = snapshot(foreign)
    assert reap_orphans(shm_dir) == []
    with pytest.raises(RegionError, match="owned by uid 65534"):
        open_region("foreign", shm_dir)
    assert snapshot(foreign) == before
    with pytest.raises(RegionError, match="owned by uid 65534"):
        remove(foreign)
    assert remove(foreign, force=True)


def test_a_held_file_that_is_not_a_region_is_refused_and_an_unheld_one_is_replaced(shm_dir: Path) -> None:
    path = shm_dir / region_file_name("junk", 0)
    path.write_bytes(os.urandom(LAYOUT.data_bytes + 65536))
    os.chmod(path, 0o600)
    before = snapshot(path)
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # some live process holds it
    try:
        with pytest.raises(RegionError, match="not start with a region header"):
            open_region("junk", shm_dir)
        assert snapshot(path) == before
    finally:
        os.close(fd)
    with open_region("junk", shm_dir, participants=2) as region:  # nobody holds it: reaped, recreated
        assert os.stat(path).st_ino != before[0] or snapshot(path) != before
        assert region.path == path


def test_a_symlink_at_the_name_is_refused_and_its_target_untouched(shm_dir: Path) -> None:
    target = shm_dir / "target.bin"
    target.write_bytes(b"precious")
    link = shm_dir / region_file_name("sym", 0)
    link.symlink_to(target)
    before = snapshot(target)
    assert reap_orphans(shm_dir) == []
    with pytest.raises(RegionError, match="cannot open existing region"):
        open_region("sym", shm_dir)
    assert snapshot(target) == before and link.is_symlink()
    with pytest.raises(RegionError, match="not a regular file"):
        remove(link)
    link.unlink()
    target.unlink()


def test_a_full_tmpfs_fails_at_creation_with_a_clear_error(shm_dir: Path) -> None:
    if not ROOT:
        pytest.skip("mounting a tiny tmpfs needs root")
    mnt = shm_dir / "tiny"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if done.returncode != 0:
        mnt.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        big = Layout(hidden_dim=1024, dtype="float32", num_blocks=1024)  # 4 MiB of data
        with pytest.raises(RegionError, match=r"cannot allocate \d+ bytes .* bytes are free in") as info:
            ShmRegion.open(instance="big", dp_rank=0, layout=big, shm_dir=mnt)
        assert "lower ec_cpu_bytes" in str(info.value)
        assert list(mnt.iterdir()) == [], "a failed creation left its staging file"
        with ShmRegion.open(instance="small", dp_rank=0, layout=LAYOUT, shm_dir=mnt) as ok:
            assert ok.removed_name
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
        mnt.rmdir()
