"""The ec-connector command line, run as a user would run it."""

from __future__ import annotations

import importlib.util
import itertools
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from .native_marks import NEEDS_PLANNER_BUILD

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ec_connector.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_demo_reloads_verified_embeddings_and_removes_its_region(tmp_path):
    result = _cli("demo", "--synthetic", "--requests", "12", "--images", "4", "--shm-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    reloaded = next(line for line in out.splitlines() if "reloaded from tier" in line)
    count = int(reloaded.split()[3])
    assert count > 0
    assert f"{count}/{count} byte-identical" in reloaded
    assert "region file removed yes" in out
    assert list(tmp_path.iterdir()) == []


def test_user_mistakes_exit_2_without_a_traceback():
    result = _cli("demo", "--synthetic", "--requests", "0")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "not > 0" in result.stderr


def test_demo_with_an_unusable_region_directory_is_a_clear_error(tmp_path):
    missing = tmp_path / "nope"
    result = _cli("demo", "--synthetic", "--requests", "2", "--shm-dir", str(missing))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert str(missing) in result.stderr


def _orphan(shm_dir: Path, instance: str) -> Path:
    """A region left by a process that was SIGKILLed before every participant mapped it."""
    code = (
        "import os, signal, sys\n"
        "from ec_connector.adapters.shm import ShmRegion\n"
        "from ec_connector.domain.layout import Layout\n"
        f"r = ShmRegion.open(instance={instance!r}, dp_rank=0, layout=Layout(64, 'bfloat16', 32),\n"
        f"    participants=2, shm_dir={str(shm_dir)!r})\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60)
    assert proc.returncode == -9
    path = shm_dir / f"vllm_ec_{instance}_dp0.mmap"
    assert path.exists()
    return path


def test_regions_gc_removes_an_orphan_of_a_sigkilled_process_and_refuses_a_live_region(tmp_path):
    from ec_connector.adapters.shm import ShmRegion
    from ec_connector.domain.layout import Layout

    shm = Path("/dev/shm") / f"ec_cli_{tmp_path.name[-12:]}"
    shm.mkdir()
    try:
        orphan = _orphan(shm, "dead")
        live = ShmRegion.open(
            instance="live", dp_rank=0, layout=Layout(64, "bfloat16", 32), participants=2, shm_dir=shm
        )
        listing = _cli("regions", "--dir", str(shm), "list")
        assert listing.returncode == 0
        lines = {line.split()[-1]: line.split()[0] for line in listing.stdout.splitlines()[1:]}
        assert lines == {str(orphan): "orphaned", str(live.path): "alive"}

        refused = _cli("regions", "--dir", str(shm), "gc", str(live.path))
        assert refused.returncode == 2 and "live process" in refused.stderr
        assert "Traceback" not in refused.stderr

        gc = _cli("regions", "--dir", str(shm), "gc")
        assert gc.returncode == 0 and "1 orphaned region file(s) removed" in gc.stdout
        assert not orphan.exists() and live.path.exists()

        forced = _cli("regions", "--dir", str(shm), "gc", "--force", str(live.path))
        assert forced.returncode == 0 and not live.path.exists()
        live.close()
    finally:
        import shutil

        shutil.rmtree(shm, ignore_errors=True)


def test_synthetic_options_without_synthetic_are_refused():
    result = _cli("demo", "--requests", "3")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "--requests apply to --synthetic only" in result.stderr


def test_real_engine_demo_without_vllm_says_how_to_get_it(tmp_path):
    result = _cli("demo", "--vllm-python", str(tmp_path / "no-python"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "--vllm-python" in result.stderr and "no such file" in result.stderr


def _cache_figures(python: str, out: Path) -> tuple[dict, subprocess.CompletedProcess[str]]:
    result = subprocess.run(
        [python, "-m", "ec_connector.cli", "bench", "cache", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    png = (out / "cache.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    figures = json.loads((out / "cache.json").read_text())
    assert figures["skipped"] is None
    for side in ("ours", "ours_fifo"):
        assert figures[side]["ops"] > 0 and figures[side]["evictions"] > 0
    return figures, result


def test_bench_cache_without_vllm_runs_our_policies_and_says_why_vllm_was_skipped(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: the vLLM column runs (the .venv-vllm test below)")
    figures, result = _cache_figures(sys.executable, tmp_path)
    assert figures["vllm"] is None and "vllm is not installed" in figures["vllm_skipped"]
    assert "EmbeddingCache column skipped" in result.stderr
    assert figures["params"]["eviction"] != "fifo"  # the default policy beside fifo
    assert set(figures["goals"]) == {"metadata_O_entries"}


def test_bench_cache_with_vllm_compares_against_its_embedding_cache(tmp_path):
    vllm_python = ROOT / ".venv-vllm" / "bin" / "python"
    if not vllm_python.exists():
        pytest.skip("the vLLM column needs vLLM: build .venv-vllm (tools/setup_vllm_env.sh)")
    figures, _ = _cache_figures(str(vllm_python), tmp_path)
    assert figures["vllm_skipped"] is None
    assert figures["vllm"]["op_counts"]["lookup"] == figures["ours"]["op_counts"]["lookup"] > 0
    assert set(figures["goals"]) == {"ops_3x_faster", "metadata_O_entries"}


def test_copy_plot_from_a_real_cpu_run(tmp_path):
    from ec_connector.benchmarks import copy_bandwidth, plots

    options = copy_bandwidth.parse_args(
        [
            "--device",
            "cpu",
            "--quick",
            "--widths",
            "1024",
            "--batches",
            "1",
            "--layouts",
            "churn",
            "--reps",
            "1",
        ]
    )
    steps: list[str] = []
    result = copy_bandwidth.run(options, steps.append)
    assert len(steps) == copy_bandwidth.cases(options) == 2
    assert all(row["save_gbs"] > 0 and row["load_gbs"] > 0 for row in result["rows"])
    plots.copy(result, tmp_path / "copy.png")
    assert (tmp_path / "copy.png").read_bytes().startswith(b"\x89PNG")


@NEEDS_PLANNER_BUILD
def test_the_plan_call_bench_times_real_planner_calls_against_a_no_op_runtime(tmp_path):
    sys.path.insert(0, str(ROOT))
    from bench import plan_call

    plan_call.main(["--iters", "20", "--sweep-mib", "1", "--json", str(tmp_path / "plan.json")])
    result = json.loads((tmp_path / "plan.json").read_text())
    assert set(result) == set(plan_call.ENTRIES)
    for timings in result.values():
        assert set(timings) == {"load warm", "load cold", "save warm", "save cold"}
        assert all(0 < t["p10_us"] <= t["median_us"] for t in timings.values())


def test_the_host_launch_bench_starts_each_call_a_period_after_the_previous_one():
    """`--period-ms`: the GPU bench paces its timed calls as once per engine step; no period, at once."""
    sys.path.insert(0, str(ROOT))
    from bench.copy_host_launch import Pacer

    paced = Pacer(0.003)
    starts = [paced.start() for _ in range(6)]
    assert all(later - earlier >= 0.003 for earlier, later in itertools.pairwise(starts))
    at_once = Pacer(0.0)
    starts = [at_once.start() for _ in range(6)]
    assert starts == sorted(starts)


def test_aging_bench_shows_the_run_floor_keeping_a_full_tables_entries_in_long_runs():
    from ec_connector.benchmarks import aging

    args = (2048, 256 * aging.MiB)  # 2 KiB rows, a 256 MiB region
    none = aging.measure(*args, floor_bytes=0, drop_share=0.05, ops=3000, strict=False)
    floor = aging.measure(*args, floor_bytes=aging.MIN_RUN_BYTES, drop_share=0.05, ops=3000, strict=False)
    assert statistics.mean(floor.runs) < 0.6 * statistics.mean(none.runs)
    assert statistics.mean(floor.short_share) < 0.01 < statistics.mean(none.short_share)
    assert statistics.mean(floor.occupancy) > 0.98  # what the floor costs: a little capacity
    assert floor.for_runs_per_put > 0 == none.for_runs_per_put


def test_bench_of_an_unknown_kind_is_a_usage_error():
    result = _cli("bench", "disk")
    assert result.returncode == 2
    assert "invalid choice: 'disk'" in result.stderr
