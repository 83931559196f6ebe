"""Engine driver: one engine (with `ec_both` or no connector) serves a fixed workload, then reports.

    python local.py MODEL_DIR OUT_JSON SPEC_JSON

SPEC_JSON: suite_engine.engine_kwargs's spec plus "workload" ([[image index, ...], ...], one chat
request each, served one at a time) and "images" (how many distinct images the pool holds).
OUT_JSON: per-request token ids and finish reasons, the items the encoder ran on (`encoded`),
the connector's counters as vLLM's stats path received them (`stats`), the runner and compilation
settings (`engine`), the seconds to start, serve and shut down.

Runs with the suite's interpreter and `tests/gpu_engine/engine` on PYTHONPATH; by hand on the CPU
machine: `VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 PYTHONPATH=tests/gpu_engine/engine
.venv-vllm/bin/python tests/gpu_engine/engine/local.py MODEL OUT SPEC` with "device": "cpu".
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from suite_engine import (
    ConnectorStats,
    EncoderRuns,
    chat,
    describe,
    engine_kwargs,
    finish,
    images,
    scheduler_connector,
    shutdown,
)


def main() -> None:
    model_dir, out_path, spec_path = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    spec = json.loads(spec_path.read_text())
    runs = EncoderRuns().install()
    from vllm import LLM

    started = time.perf_counter()
    llm = LLM(**engine_kwargs(model_dir, spec))
    start_s = time.perf_counter() - started
    runs.clear()  # start-up profiling is not the workload
    stats = ConnectorStats(scheduler_connector(llm)) if spec.get("connector") else None
    pool = images(int(spec.get("images", 8)))
    results = []
    started = time.perf_counter()
    for request in spec["workload"]:
        comp = chat(llm, pool, request).outputs[0]
        results.append({"token_ids": list(comp.token_ids), "finish_reason": comp.finish_reason})
    serve_s = time.perf_counter() - started
    report = {
        "requests": results,
        "encoded": list(runs.items),
        "hooked": runs.hooked,
        "stats": stats.total() if stats is not None else None,
        "engine": describe(llm),
        "start_s": start_s,
        "serve_s": serve_s,
    }
    report["shutdown_s"] = shutdown(llm)
    finish(out_path, report)


if __name__ == "__main__":
    main()
