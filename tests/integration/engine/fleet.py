"""Engine script for fleet sharing: one replica (`ec_both`, NIXL on, `fleet_peers` set) that runs the
commands the test hands it, one at a time.

Run with the vLLM venv's python:
    python fleet.py NAME MODEL_DIR WORK_DIR CONFIG_JSON

After the engine is up it writes WORK_DIR/NAME.ready, then runs WORK_DIR/NAME.cmd.N.json for N = 0,
1, ... as each appears and answers each with WORK_DIR/NAME.res.N.json (written whole, by rename).
It stops when WORK_DIR/stop exists or CONFIG_JSON's "serve_s" passes. Commands:

    {"op": "generate", "image": i, "salt": str | null}
        one request of image i (local_tier.images()) under that cache_salt; answers its tokens,
        seconds, the identifiers the encoder ran on, and the fleet and peer counters after it
    {"op": "wait_peer", "peer": id, "present": bool, "within_s": s}
        until the peer directory has (or no longer has) the peer; answers whether it came to be
    {"op": "wait_records", "peer": id, "count": n, "within_s": s}
        until the directory holds at least n records of that peer
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from local_tier import images, install_encoder_counter, tiny_engine


def generate(llm, image: int, salt: str | None) -> dict:  # noqa: ANN001
    from vllm import SamplingParams

    prompt: dict = {
        "prompt": "<|vision_start|><|image_pad|><|vision_end|>Describe.",
        "multi_modal_data": {"image": images()[image]},
    }
    if salt is not None:
        prompt["cache_salt"] = salt
    sampling = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    (out,) = llm.generate(prompt, sampling, use_tqdm=False)
    comp = out.outputs[0]
    return {"token_ids": list(comp.token_ids), "finish_reason": comp.finish_reason}


def wait(condition, timeout_s: float) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def run(llm, directory, encoded: list[str], command: dict) -> dict:  # noqa: ANN001
    op = command["op"]
    if op == "generate":
        before = len(encoded)
        started = time.perf_counter()
        result = generate(llm, command["image"], command.get("salt"))
        result["seconds"] = time.perf_counter() - started
        result["encoded"] = encoded[before:]
        return result
    peer = command["peer"]
    if op == "wait_peer":
        return {
            "ok": wait(lambda: (directory.peer(peer) is not None) == command["present"], command["within_s"])
        }
    if op == "wait_records":
        return {"ok": wait(lambda: directory.entries_of(peer) >= command["count"], command["within_s"])}
    raise ValueError(f"unknown command {command!r}")


def main() -> None:
    name, model_dir, work, config_path = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    config = json.loads(Path(config_path).read_text())
    encoded = install_encoder_counter()
    llm = tiny_engine(model_dir, images_per_prompt=1, ec_transfer_config=config["connector"])
    connector = llm.llm_engine.engine_core.engine_core.scheduler.ec_connector
    container = connector._container
    directory = container.peer_directory()
    (work / f"{name}.ready").touch()
    deadline = time.monotonic() + config.get("serve_s", 600)
    n = 0
    while not (work / "stop").exists() and time.monotonic() < deadline:
        command_path = work / f"{name}.cmd.{n}.json"
        if not command_path.exists():
            time.sleep(0.05)
            continue
        result = run(llm, directory, encoded, json.loads(command_path.read_text()))
        result["fleet"] = container.fleet_stats().as_dict()
        result["peer"] = container.peer_stats().as_dict()
        result["tier"] = connector._scheduler.stats.as_dict()
        partial = work / f"{name}.res.{n}.json.part"
        partial.write_text(json.dumps(result))
        os.replace(partial, work / f"{name}.res.{n}.json")
        n += 1


if __name__ == "__main__":
    main()
