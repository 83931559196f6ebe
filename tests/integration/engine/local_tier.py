"""Engine script: serve a fixed multimodal workload on a real vLLM engine and report what happened.

Run with the vLLM venv's python (not under pytest):
    python local_tier.py MODEL_DIR OUT_JSON CONFIG_JSON

CONFIG_JSON: {"connector": null | {ec_transfer_config}, "engine_cache_rows": int,
              "workload": [[image index, ...], ...], "tp": 1}
Writes: per-request token ids, the identifiers the engine's encoder ran on, and the scheduler-side
connector's counters and occupancy (single-process engines only).
"""

from __future__ import annotations

import json
import sys

from vllm.v1.core.encoder_cache_manager import EncoderCacheManager


class SmallEncoderCache(EncoderCacheManager):
    """vLLM's encoder cache with a test-chosen size (rows), so items must come from our tier."""

    @classmethod
    def create_manager(cls, *, cache_size, vllm_config):  # noqa: ANN001, ANN206
        rows = vllm_config.ec_manager_config.manager_config.get("cache_size", cache_size)
        return cls(cache_size=int(rows))


def images():
    import numpy as np
    from PIL import Image

    sizes = [(100, 80), (112, 112), (56, 56), (84, 112), (112, 56), (70, 98), (100, 100), (60, 90)]
    out = []
    for i, (w, h) in enumerate(sizes):
        rng = np.random.default_rng(100 + i)
        out.append(Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)))
    return out


def install_encoder_counter() -> list[str]:
    """Record the identifier of every item vLLM's encoder runs on (single-process engines)."""
    from vllm.v1.worker import gpu_model_runner

    encoded: list[str] = []
    batch = gpu_model_runner.GPUModelRunner._batch_mm_inputs_from_scheduler

    def counting(self, scheduler_output):  # noqa: ANN001, ANN202
        hashes, kwargs, refs = batch(self, scheduler_output)
        encoded.extend(hashes)
        return hashes, kwargs, refs

    gpu_model_runner.GPUModelRunner._batch_mm_inputs_from_scheduler = counting
    return encoded


def tiny_engine(model_dir: str, *, images_per_prompt: int, max_num_seqs: int = 2, tp: int = 1, **kwargs):  # noqa: ANN003, ANN201
    """The engine every script here serves the tiny model with: eager, greedy-ready, prefix caching off
    (a repeated prompt would skip the encoder), single-process unless TP > 1; `kwargs` add the
    connector (`ec_transfer_config`) and vLLM's encoder-cache manager (`ec_manager_config`)."""
    from vllm import LLM

    return LLM(
        model=model_dir,
        distributed_executor_backend="uni" if tp == 1 else "mp",
        tensor_parallel_size=tp,
        dtype="bfloat16",
        max_model_len=512,
        max_num_seqs=max_num_seqs,
        seed=0,
        enforce_eager=True,
        enable_prefix_caching=False,
        limit_mm_per_prompt={"image": images_per_prompt},
        **kwargs,
    )


def main() -> None:
    model_dir, out_path, config_path = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(config_path) as f:
        config = json.load(f)

    from vllm import SamplingParams

    encoded = install_encoder_counter()

    kwargs = {}
    if config.get("connector"):
        kwargs["ec_transfer_config"] = config["connector"]
    if config.get("engine_cache_rows"):
        kwargs["ec_manager_config"] = {
            "encoder_cache_manager_cls": "local_tier.SmallEncoderCache",
            "manager_config": {"cache_size": config["engine_cache_rows"]},
        }
    tp = config.get("tp", 1)
    llm = tiny_engine(model_dir, images_per_prompt=3, tp=tp, **kwargs)
    seen_stats = None
    connector = None
    if tp == 1 and config.get("connector"):
        connector = llm.llm_engine.engine_core.engine_core.scheduler.ec_connector
        report_stats = connector.get_ec_connector_stats

        def recording():  # what vLLM's scheduler receives every step, aggregated as vLLM does
            nonlocal seen_stats
            stats = report_stats()
            if stats is not None:
                seen_stats = stats if seen_stats is None else seen_stats.aggregate(stats)
            return stats

        connector.get_ec_connector_stats = recording
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    pool = images()
    results = []
    for n, request in enumerate(config["workload"]):
        if n == config.get("kill_after", -1):
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        content = [{"type": "image_pil", "image_pil": pool[i]} for i in request]
        content.append({"type": "text", "text": "Describe."})
        (out,) = llm.chat([{"role": "user", "content": content}], params, use_tqdm=False)
        comp = out.outputs[0]
        results.append({"token_ids": list(comp.token_ids), "finish_reason": comp.finish_reason})

    report = {"requests": results, "encoded": encoded}
    if connector is not None:
        sched = connector._scheduler
        sched.poll()
        report["stats"] = sched.stats.as_dict()
        occ = sched.occupancy()
        report["occupancy"] = {"entries": occ.entries, "used_bytes": occ.used_bytes}
        report["reported_stats"] = seen_stats.reduce() if seen_stats is not None else {}
    with open(out_path, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
