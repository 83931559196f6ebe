"""Engine driver for E→PD: an `ec_producer` or an `ec_consumer` engine, each in its own process.

    python epd.py producer MODEL_DIR WORK_DIR SPEC_JSON
    python epd.py consumer MODEL_DIR WORK_DIR SPEC_JSON

SPEC_JSON: suite_engine.engine_kwargs's spec plus "workload" ([[image index, ...], ...]),
"images" (pool size); the producer's "serve_s" (how long it stays up at most); the consumer's
"pause_after" (a request index, or null) and "pause_s".

The producer serves every request of the workload (encoder only), writes each request's
`ec_transfer_params` to WORK_DIR/params.json, then keeps its engine up (its side channel and NIXL
agent answer consumers) until WORK_DIR/stop exists, and writes WORK_DIR/producer.json.
The consumer sends the same requests, one at a time, each with the producer's params in
`SamplingParams.extra_args`, as an orchestrator does. After each request it appends
{"done": n} to WORK_DIR/progress.jsonl; after request "pause_after" it also appends
{"paused": n, "stats": ...} and waits for WORK_DIR/go (the test stops the producer meanwhile).
It writes WORK_DIR/consumer.json: per-request tokens, seconds and the items its encoder ran on.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

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


def wait_for(path: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {seconds} s")
        time.sleep(0.05)


def append(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def produce(llm: Any, runs: EncoderRuns, stats: ConnectorStats, spec: dict, work: Path) -> dict:
    pool = images(int(spec.get("images", 8)))
    published = []
    for request in spec["workload"]:
        started = time.perf_counter()
        out = chat(llm, pool, request)
        published.append({"params": out.ec_transfer_params, "seconds": time.perf_counter() - started})
    tmp = work / "params.tmp"
    tmp.write_text(json.dumps(published))
    tmp.replace(work / "params.json")
    encoded = list(runs.items)
    deadline = time.monotonic() + float(spec.get("serve_s", 300))
    while not (work / "stop").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"encoded": encoded, "stats": stats.total()}


def consume(llm: Any, runs: EncoderRuns, stats: ConnectorStats, spec: dict, work: Path) -> dict:
    pool = images(int(spec.get("images", 8)))
    published = json.loads((work / "params.json").read_text())
    progress = work / "progress.jsonl"
    results = []
    for n, (request, sent) in enumerate(zip(spec["workload"], published, strict=True)):
        before = len(runs.items)
        started = time.perf_counter()
        out = chat(llm, pool, request, {"ec_transfer_params": sent["params"]})
        comp = out.outputs[0]
        results.append(
            {
                "token_ids": list(comp.token_ids),
                "finish_reason": comp.finish_reason,
                "seconds": time.perf_counter() - started,
                "encoded": runs.items[before:],
            }
        )
        append(progress, {"done": n})
        if n == spec.get("pause_after"):
            append(progress, {"paused": n, "stats": stats.total()})
            wait_for(work / "go", float(spec.get("pause_s", 120)))
    return {"requests": results, "encoded": list(runs.items), "stats": stats.total()}


def main() -> None:
    role, model_dir, work, spec_path = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    if role not in ("producer", "consumer"):
        raise SystemExit(f"unknown role {role!r}: producer or consumer")
    spec = json.loads(spec_path.read_text())
    runs = EncoderRuns().install()
    from vllm import LLM

    started = time.perf_counter()
    llm = LLM(**engine_kwargs(model_dir, spec))
    start_s = time.perf_counter() - started
    runs.clear()  # start-up profiling is not the workload
    stats = ConnectorStats(scheduler_connector(llm))
    serve = produce if role == "producer" else consume
    report = serve(llm, runs, stats, spec, work)
    report.update(engine=describe(llm), start_s=start_s)
    report["shutdown_s"] = shutdown(llm)
    finish(work / f"{role}.json", report)


if __name__ == "__main__":
    main()
