"""The side-by-side benchmarks against vLLM's in-tree CPU EC connector run (--quick) and report both sides.

Each bench runs under `.venv-vllm/bin/python` in a subprocess (it needs vLLM and this package);
the checks are on the JSON's structure and on properties that follow from the two designs (no
timing is asserted): vLLM's cache metadata grows with the region and ours does not; vLLM's ack
carries a descriptor per block of the region and ours carries the entry's runs.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _run_bench(python: Path, script: str, out: Path, *args: str, timeout: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(python), str(REPO_ROOT / "bench" / script), "--quick", "--json", str(out), *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    res = json.loads(out.read_text())
    assert res["skipped"] is None, f"{script} skipped under .venv-vllm: {res['skipped']}"
    return res


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and value > 0


def test_compare_cache_quick_reports_both_caches(vllm_python: Path, tmp_path: Path) -> None:
    res = _run_bench(vllm_python, "compare_cache.py", tmp_path / "cache.json", "--steps", "120", timeout=120)
    assert res["bench"] == "compare_cache" and res["vllm_skipped"] is None
    for side in ("ours", "vllm"):
        fig = res[side]
        assert _positive(fig["ops_per_s"]) and _positive(fig["ops"])
        assert all(_positive(fig["step_us"][q]) for q in ("median", "p90", "p99"))
        assert _positive(fig["op_ns"]["lookup"]) and _positive(fig["op_ns"]["alloc"])
        assert fig["op_counts"]["alloc"] > 0 and fig["evictions"] > 0, "the trace must evict"
        assert fig["runs_per_entry"]["alloc_mean"] >= 1
        assert all(_positive(fig["metadata_bytes"][k]) for k in ("empty", "empty_4x_region", "after_trace"))
    # both replayed the same trace: the same lookups (one per item per step, whatever the cache holds)
    assert res["ours"]["op_counts"]["lookup"] == res["vllm"]["op_counts"]["lookup"]
    # vLLM keeps a free list of block ids (O(blocks)); our free extents do not grow with the region
    vllm_mem, our_mem = res["vllm"]["metadata_bytes"], res["ours"]["metadata_bytes"]
    assert vllm_mem["empty_4x_region"] > 3 * vllm_mem["empty"]
    assert our_mem["empty_4x_region"] < 1.5 * our_mem["empty"]
    assert set(res["ratios"]) >= {"ops_per_s", "step_us_median", "metadata_after_trace", "op_ns"}
    assert set(res["goals"]) == {"ops_3x_faster", "metadata_O_entries"}


def test_compare_p2p_quick_reports_both_flows(vllm_python: Path, tmp_path: Path) -> None:
    res = _run_bench(vllm_python, "compare_p2p.py", tmp_path / "p2p.json", "--sizes", "1", "9", timeout=240)
    assert res["bench"] == "compare_p2p"
    for side in ("ours", "vllm"):
        for mib in ("1", "9"):
            fig = res[side]["per_size"][mib]
            assert fig["n"] >= 1
            assert _positive(fig["e2e_ms"]) and _positive(fig["read_ms"]) and fig["e2e_ms"] >= fig["read_ms"]
            assert _positive(fig["ack_bytes"]) and _positive(fig["descriptors"])
        assert len(res[side]["cold_e2e_ms"]) == res["params"]["rounds"]
    for mib in ("1", "9"):
        ours, theirs = res["ours"]["per_size"][mib], res["vllm"]["per_size"][mib]
        # vLLM reads one descriptor per block; ours one per contiguous run
        assert theirs["descriptors"] == theirs["size_bytes"] // res["params"]["row_bytes"]
        assert ours["descriptors"] <= theirs["descriptors"]
        # vLLM's ack lists every block of its region; ours the entry's runs and the agent's metadata
        assert ours["ack_bytes"] < theirs["ack_bytes"]
        assert set(res["ratios"][mib]) == {"e2e_ms", "read_ms", "ack_bytes", "descriptors"}
    assert res["vllm"]["ack_bytes_2gib_region"] > res["vllm"]["per_size"]["9"]["ack_bytes"]
    assert set(res["goals"]) == {"time_9mib_le_0.8x", "ack_O_entry"}
