"""Engine script for E→PD transfer: a producer engine or a consumer engine, in its own process.

Run with the vLLM venv's python:
    python p2p.py producer MODEL_DIR WORK_DIR CONFIG_JSON
    python p2p.py consumer MODEL_DIR WORK_DIR CONFIG_JSON
    python p2p.py faults MODEL_DIR WORK_DIR CONFIG_JSON

The producer serves the workload's requests (encoder only), writes each request's
`ec_transfer_params` to WORK_DIR/params.json, then keeps its engine alive (its control thread keeps
answering consumers) until WORK_DIR/stop exists. The consumer sends the same requests with those
params in `SamplingParams.extra_args` (the requests listed in "metadata_only" without their media,
as an orchestrator rewrites them) and writes its tokens and the items its encoder ran on.

`faults` is a consumer engine that serves CONFIG_JSON's "steps" in order, one request each: images
by index with optional params, or a metadata-only item (`meta_only`: no media, only the placeholder
metadata and the item's identifier, as vLLM accepts on an EC consumer through an `image_embeds`
part without the embedding). After each step it appends {"done": name} to WORK_DIR/progress.jsonl
(the test acts on it); at the end it writes WORK_DIR/faults.json: per-step tokens, finish reason,
seconds and the items the encoder ran on, the peer counters and the tier phase of the "watch" keys.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from local_tier import images, install_encoder_counter, tiny_engine


def chat(llm, params, request, extra_args=None):  # noqa: ANN001, ANN201
    from vllm import SamplingParams

    pool = images()
    content = [{"type": "image_pil", "image_pil": pool[i]} for i in request]
    content.append({"type": "text", "text": "Describe."})
    sampling = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, extra_args=extra_args)
    (out,) = llm.chat([{"role": "user", "content": content}], sampling, use_tqdm=False)
    return out


def chat_metadata_only(llm, key: str, metadata: dict, extra_args: dict | None):  # noqa: ANN001, ANN201
    """One image given only by its placeholder metadata and identifier: nothing to encode locally."""
    from vllm import SamplingParams

    content = [
        {"type": "image_embeds", "image_embeds": dict(metadata), "uuid": key},
        {"type": "text", "text": "Describe."},
    ]
    sampling = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, extra_args=extra_args)
    (out,) = llm.chat([{"role": "user", "content": content}], sampling, use_tqdm=False)
    return out


def serve_steps(llm, connector, encoded: list[str], config: dict, work: Path) -> None:  # noqa: ANN001
    results = []
    for step in config["steps"]:
        extra = {"ec_transfer_params": step["params"]} if step.get("params") else None
        before = len(encoded)
        started = time.perf_counter()
        if "meta_only" in step:
            out = chat_metadata_only(llm, step["meta_only"]["key"], step["meta_only"]["metadata"], extra)
        else:
            out = chat(llm, None, step["images"], extra)
        comp = out.outputs[0]
        results.append(
            {
                "name": step["name"],
                "token_ids": list(comp.token_ids),
                "finish_reason": comp.finish_reason,
                "seconds": time.perf_counter() - started,
                "encoded": encoded[before:],
            }
        )
        with open(work / "progress.jsonl", "a") as f:
            f.write(json.dumps({"done": step["name"]}) + "\n")
    phases = {}
    for key in config.get("watch", []):
        entry = connector._scheduler.entry(key)
        phases[key] = None if entry is None else entry.phase.value
    report = {
        "requests": {r["name"]: r for r in results},
        "encoded": encoded,
        "peer": connector._container.peer_stats().as_dict(),
        "phases": phases,
    }
    (work / "faults.json").write_text(json.dumps(report))


def main() -> None:
    role, model_dir, work, config_path = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    config = json.loads(Path(config_path).read_text())
    encoded = install_encoder_counter()
    llm = tiny_engine(model_dir, images_per_prompt=3, ec_transfer_config=config["connector"])
    connector = llm.llm_engine.engine_core.engine_core.scheduler.ec_connector
    if role == "faults":
        serve_steps(llm, connector, encoded, config, work)
        return
    if role == "producer":
        params = []
        for request in config["workload"]:
            started = time.perf_counter()
            out = chat(llm, None, request)
            params.append({"params": out.ec_transfer_params, "seconds": time.perf_counter() - started})
        (work / "params.json").write_text(json.dumps(params))
        deadline = time.monotonic() + config.get("serve_s", 120)
        while not (work / "stop").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = connector._container.peer_stats().as_dict()
        (work / "producer.json").write_text(json.dumps({"encoded": encoded, "peer": stats}))
        return
    params = json.loads((work / "params.json").read_text())
    metadata_only = set(config.get("metadata_only", []))  # requests sent as an orchestrator rewrites them
    results = []
    for n, (request, published) in enumerate(zip(config["workload"], params, strict=True)):
        started = time.perf_counter()
        extra = {"ec_transfer_params": published["params"]}
        if n in metadata_only:
            ((key, item),) = published["params"].items()  # one image: no media, only its metadata
            out = chat_metadata_only(llm, key, item["metadata"], extra)
        else:
            out = chat(llm, published["params"], request, extra)
        comp = out.outputs[0]
        results.append(
            {
                "token_ids": list(comp.token_ids),
                "finish_reason": comp.finish_reason,
                "seconds": time.perf_counter() - started,
                "metadata_only": n in metadata_only,
            }
        )
    report = {
        "requests": results,
        "encoded": encoded,
        "peer": connector._container.peer_stats().as_dict(),
        "tier": connector._scheduler.stats.as_dict(),
    }
    (work / "consumer.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
