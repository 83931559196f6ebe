"""The /dev/shm region adapter's crash safety: SIGKILL at any point leaves at most an orphan that the
next start or the reaper removes, another instance's files are never touched, and listing tells
alive regions from orphans."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from ec_connector.adapters.shm import REGION_GLOB, list_regions, reap_orphans, region_file_name, remove
from ec_connector.domain.errors import RegionError
from tests.contract.shm_region_helpers import (
    child_result,
    dir_snapshot,
    fork_child,
    instance_name,
    open_region,
    sigkill,
    snapshot,
)

# -- crash safety -----------------------------------------------------------------------------


def test_sigkill_before_all_joined_leaves_an_orphan_the_next_start_removes(shm_dir: Path) -> None:
    instance = instance_name()
    path = shm_dir / region_file_name(instance, 0)
    for cycle in range(20):
        pid, r = fork_child(lambda: str(open_region(instance, shm_dir, participants=2).path))
        assert child_result(r) == str(path)
        sigkill(pid)
        assert path.exists(), "killed before the second participant joined: the file is still there"
        assert list_regions(shm_dir)[0].orphaned
        if cycle % 2 == 0:  # a restart with the same engine_id starts cleanly
            with open_region(instance, shm_dir, participants=2) as region:
                assert region.joined_pids()[0] == os.getpid()
                assert region.creator_pid == os.getpid()
        else:
            assert reap_orphans(shm_dir) == [path]
        assert not path.exists()
    assert list(shm_dir.glob("*vllm_ec_*")) == []


def test_sigkill_at_random_points_of_create_join_close_leaves_nothing_after_reaping(shm_dir: Path) -> None:
    instance = instance_name()
    rng = random.Random(1234)
    leftovers: list[str] = []
    for _ in range(10):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            try:
                os.close(r)
                os.write(w, b"s")
                slot = 0
                while True:  # create, join, close, over and over, until killed
                    region = open_region(instance, shm_dir, participants=2, slot=slot)
                    region.close()
            finally:
                os._exit(1)
        os.close(w)
        assert os.read(r, 1) == b"s"
        os.close(r)
        time.sleep(rng.uniform(0.01, 0.06))
        sigkill(pid)
        left = sorted(p.name for p in shm_dir.iterdir())
        leftovers.extend(left)
        assert sorted(p.name for p in reap_orphans(shm_dir)) == left
        assert list(shm_dir.iterdir()) == []
    print("left behind by the kills, then reaped:", leftovers)


def test_sigkill_after_all_joined_leaves_nothing_at_all(shm_dir: Path) -> None:
    instance = instance_name()
    procs = [
        fork_child(lambda s=s: str(open_region(instance, shm_dir, participants=2, slot=s).removed_name))
        for s in (0, 1)
    ]
    assert sorted(child_result(r) for _, r in procs) == ["False", "True"]
    for pid, _ in procs:
        sigkill(pid)
    assert list(shm_dir.iterdir()) == []
    assert reap_orphans(shm_dir) == []


def test_a_second_instance_on_the_same_host_is_never_touched(shm_dir: Path) -> None:
    mine, live_other, dead_other = instance_name(), instance_name(), instance_name()
    with open_region(live_other, shm_dir, participants=2) as other:
        pid, r = fork_child(lambda: str(open_region(dead_other, shm_dir, participants=2).path))
        orphan = Path(child_result(r))
        sigkill(pid)
        before = dir_snapshot(shm_dir)
        for _ in range(3):
            with open_region(mine, shm_dir) as region:  # participants=1: created, joined, name removed
                assert region.removed_name
            with open_region(mine, shm_dir, participants=2):  # closed before the second joins
                pass
            assert reap_orphans(shm_dir, name=region_file_name(mine, 0)) == []
        assert dir_snapshot(shm_dir) == before
        assert reap_orphans(shm_dir) == [orphan]
        assert other.path.exists() and snapshot(other.path) == before[other.path.name]
    assert list(shm_dir.iterdir()) == []


def test_close_removes_the_name_only_when_no_one_else_holds_the_file(shm_dir: Path) -> None:
    instance = instance_name()
    first = open_region(instance, shm_dir, participants=3, slot=0)
    second = open_region(instance, shm_dir, participants=3, slot=1)
    first.close()
    assert second.path.exists() and not first.removed_name
    second.close()
    assert not second.path.exists() and second.removed_name
    second.close()


def test_an_unjoined_forked_copy_closing_does_not_drop_the_owners_lock(shm_dir: Path) -> None:
    region = open_region(instance_name(), shm_dir, participants=2)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        region.close()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert region.path.exists()
    assert reap_orphans(shm_dir) == [], "the owner is alive: its file is not an orphan"
    region.close()


# -- list / gc ----------------------------------------------------------------------------------


def test_list_regions_tells_alive_from_orphaned_and_remove_refuses_live_ones(shm_dir: Path) -> None:
    live = open_region(instance_name(), shm_dir, participants=2, ranks=2)
    pid, r = fork_child(lambda: str(open_region(instance_name(), shm_dir, participants=3).path))
    orphan = Path(child_result(r))
    sigkill(pid)
    infos = {info.path: info for info in list_regions(shm_dir)}
    assert set(infos) == {live.path, orphan}
    assert infos[live.path].state == "alive" and infos[live.path].creator_pid == os.getpid()
    assert infos[live.path].size_bytes == live.geometry.file_size
    assert infos[live.path].joined_pids == (os.getpid(),)
    assert infos[live.path].header is not None and infos[live.path].header.ranks == 2
    assert infos[orphan].state == "orphaned" and infos[orphan].creator_pid == pid

    with pytest.raises(RegionError, match="held by a live process"):
        remove(live.path)
    assert live.path.exists()
    assert remove(orphan) is True and not orphan.exists()
    assert remove(orphan) is False
    with pytest.raises(RegionError, match="not a region file"):
        remove(shm_dir / "something_else.bin")
    assert remove(live.path, force=True) is True
    view = live.data()  # the live process keeps its memory
    view[:2] = b"ok"
    assert bytes(view[:2]) == b"ok"
    view.release()
    live.close()
    assert list(shm_dir.glob(REGION_GLOB)) == []
