"""The serving bench's CPU split of an engine's process tree, on real processes and real /proc."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from ec_connector.benchmarks import proc_cpu

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")

# a child whose busy thread is its main thread ("main") or another thread ("other"), for SPIN_S
CHILD = """
import sys, threading, time
spin_s, where = float(sys.argv[1]), sys.argv[2]
def spin():
    end = time.thread_time() + spin_s
    while time.thread_time() < end:
        pass
print("up", flush=True)
sys.stdin.readline()
if where == "main":
    spin()
else:
    t = threading.Thread(target=spin)
    t.start()
    t.join()
print("done", flush=True)
sys.stdin.readline()
"""
SPIN_S = 0.4


def _spend(where: str) -> list[dict]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(SPIN_S), where],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "up"
        before = proc_cpu.snapshot()
        assert child.pid in before
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
        after = proc_cpu.snapshot()
        child.stdin.write("end\n")
        child.stdin.flush()
    finally:
        child.wait(timeout=10)
    return [p for p in proc_cpu.delta(before, after) if p["pid"] == child.pid]


def test_a_busy_main_thread_is_counted_as_the_main_thread() -> None:
    (spent,) = _spend("main")
    assert spent["main_cpu_s"] >= SPIN_S * 0.7
    assert spent["others_cpu_s"] < 0.1
    assert spent["comm"].startswith("python")


def test_a_busy_other_thread_is_counted_apart_from_the_main_thread() -> None:
    (spent,) = _spend("other")
    assert spent["others_cpu_s"] >= SPIN_S * 0.7
    assert spent["main_cpu_s"] < 0.1
    assert spent["main_voluntary"] >= 1  # it blocked in join()


def test_descendants_are_found_below_the_root_and_gone_ones_are_left_out() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 5
        while child.pid not in proc_cpu.descendants(proc_cpu.os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert child.pid in proc_cpu.snapshot()
        assert proc_cpu.descendants(child.pid) == [child.pid]
    finally:
        child.kill()
        child.wait()
    assert child.pid not in proc_cpu.snapshot()
    assert proc_cpu.process(child.pid) is None


def test_the_busiest_is_the_process_whose_main_thread_spent_most() -> None:
    spent = [
        {"pid": 1, "main_cpu_s": 0.2, "others_cpu_s": 3.0},
        {"pid": 2, "main_cpu_s": 0.9, "others_cpu_s": 0.0},
    ]
    assert proc_cpu.busiest(spent)["pid"] == 2
    assert proc_cpu.busiest([]) is None


def test_a_tree_without_proc_is_empty(tmp_path: Path) -> None:
    assert proc_cpu.snapshot(1, proc=tmp_path / "none") == {}
