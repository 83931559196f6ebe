"""The serving bench's summary of a torch-profiler trace: the step thread, self times, CUDA calls
and the GPU's share, read from a trace file as vLLM writes it (gzipped Chrome JSON)."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

from ec_connector.benchmarks import trace_summary


def _x(name: str, cat: str, ts: float, dur: float, tid: int = 1, pid: int = 7) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid}


# the step thread (tid 1): a 1000 µs step holding a 300 µs op (itself holding a 100 µs sync) and a
# 200 µs op, then 500 µs of nothing, then a 100 µs op; another thread (tid 2) with 50 µs; the GPU
EVENTS = [
    _x("step", "user_annotation", 0, 1000),
    _x("aten::mm", "cpu_op", 100, 300),
    _x("cudaStreamSynchronize", "cuda_runtime", 150, 100),
    _x("aten::add", "cpu_op", 500, 200),
    _x("cudaLaunchKernel", "cuda_runtime", 520, 10),
    _x("aten::add", "cpu_op", 1500, 100),
    _x("poll", "python_function", 0, 50, tid=2),
    _x("ec_tier.save_caches", "user_annotation", 10, 20, tid=2),
    _x("ec_tier.save_caches", "user_annotation", 40, 5, tid=2),
    _x("gemm", "kernel", 200, 400, tid=9),
    _x("Memcpy DtoH", "gpu_memcpy", 700, 80, tid=10),
    {"ph": "i", "name": "marker", "ts": 5, "pid": 7, "tid": 1},  # not a complete event
]


def _write(path: Path, events: list[dict]) -> Path:
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events, "schemaVersion": 1}, f)
    return path


def test_the_step_thread_its_self_times_calls_and_the_gpu_share(tmp_path: Path) -> None:
    got = trace_summary.summarize(trace_summary.load(_write(tmp_path / "w.pt.trace.json.gz", EVENTS)))
    assert got["step_thread"] == {"pid": "7", "tid": "1", "events": 6}
    assert got["span_ms"] == 1.6
    assert got["covered_share"] == round(1100 / 1600, 4)  # the 500 µs gap is not covered
    ops = dict(got["ops"])
    assert ops["step"] == 0.5  # 1000 less its children's 300 and 200
    assert ops["aten::mm"] == 0.2 and ops["cudaStreamSynchronize"] == 0.1
    assert ops["aten::add"] == 0.29  # 190 self in the step, 100 after it
    assert got["ops"][0][0] == "step"
    assert got["cuda_calls"] == [["cudaStreamSynchronize", 1, 0.1], ["cudaLaunchKernel", 1, 0.01]]
    assert got["hook_ranges"] == {"ec_tier.save_caches": [2, 0.025]}
    # 500 µs, between the step and the last add, starting 1 ms into the span
    assert got["gaps"] == {"over_min": 1, "over_min_ms": 0.5, "largest": [[0.5, "step", "aten::add", 1.0]]}
    assert got["gpu"] == {"kernels": 1, "kernel_ms": 0.4, "copy_ms": 0.08, "kernel_share": 0.25}


def test_a_trace_without_host_events_has_no_step_thread(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps([_x("gemm", "kernel", 0, 10)]))  # a bare event list is read too
    got = trace_summary.summarize(trace_summary.load(path))
    assert got["step_thread"] is None and got["ops"] == [] and got["hook_ranges"] == {}


def test_a_folder_gives_one_summary_per_trace_written_since(tmp_path: Path) -> None:
    old = _write(tmp_path / "old.pt.trace.json.gz", EVENTS)
    since = time.time() + 1
    new = _write(tmp_path / "new.pt.trace.json.gz", EVENTS)
    os.utime(old, (since - 10, since - 10))
    os.utime(new, (since + 1, since + 1))
    got = trace_summary.summarize_dir(tmp_path, since=since, top=2)
    assert [g["file"] for g in got] == ["new.pt.trace.json.gz"]
    assert len(got[0]["ops"]) == 2
    assert trace_summary.summarize_dir(tmp_path / "missing") == []


def test_a_profiled_run_turns_on_the_connectors_hook_ranges_by_their_own_variable() -> None:
    from ec_connector.adapters import profile_ranges
    from ec_connector.benchmarks import serving_children

    assert serving_children.PROFILE_RANGES_ENV == profile_ranges.ENV
    assert trace_summary.RANGE_PREFIX == "ec_tier."
    assert profile_ranges.enabled({profile_ranges.ENV: "1"})
