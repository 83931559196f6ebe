"""Engine script: does vLLM's item identifier depend on a request's `cache_salt`?

Run with the vLLM venv's python (not under pytest):
    python scope_probe.py MODEL_DIR OUT_JSON ENGINE_ID

One real engine (`ec_both`, ECTierConnector, vLLM's own encoder cache cut to one item so our tier is
asked) serves the same image under two salts and without one, with another image in between to
push the first out of vLLM's cache. Writes, per request: its salt, the identifiers and mm_hashes
vLLM handed the connector, the identifiers it asked the tier for (`has_cache_item`: only on a miss
of vLLM's own cache), the tier hits it scored, and the items the encoder ran on.
"""

from __future__ import annotations

import json
import sys

from local_tier import images, install_encoder_counter, tiny_engine

# (image index, cache_salt): image 1 between the image-0 requests evicts it from vLLM's cache; the
# last request follows one of the same image, so vLLM's own cache still holds it.
WORKLOAD = [(0, "tenant-a"), (1, None), (0, "tenant-b"), (1, "tenant-a"), (0, None), (0, "tenant-c")]


def main() -> None:
    model_dir, out_path, engine_id = sys.argv[1], sys.argv[2], sys.argv[3]
    from vllm import SamplingParams

    encoded = install_encoder_counter()
    llm = tiny_engine(
        model_dir,
        images_per_prompt=1,
        max_num_seqs=1,
        ec_transfer_config={
            "ec_connector": "ECTierConnector",
            "ec_connector_module_path": "ec_connector.adapters.vllm",
            "ec_role": "ec_both",
            "engine_id": engine_id,
            "ec_connector_extra_config": {"ec_cpu_bytes": 1 << 20},
        },
        ec_manager_config={
            "encoder_cache_manager_cls": "local_tier.SmallEncoderCache",
            "manager_config": {"cache_size": 16},
        },
    )
    connector = llm.llm_engine.engine_core.engine_core.scheduler.ec_connector
    seen: list[dict] = []
    ensure = connector.ensure_cache_available

    def recording(request, num_computed_tokens):  # noqa: ANN001, ANN202
        seen.append(
            {
                "cache_salt": request.cache_salt,
                "identifiers": [f.identifier for f in request.mm_features],
                "mm_hashes": [f.mm_hash for f in request.mm_features],
            }
        )
        return ensure(request, num_computed_tokens)

    connector.ensure_cache_available = recording
    asked: list[str] = []
    has_item = connector.has_cache_item

    def asking(identifier):  # noqa: ANN001, ANN202
        asked.append(identifier)
        return has_item(identifier)

    connector.has_cache_item = asking
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    pool = images()
    report = []
    for index, salt in WORKLOAD:
        prompt: dict = {
            "prompt": "<|vision_start|><|image_pad|><|vision_end|>Describe.",
            "multi_modal_data": {"image": pool[index]},
        }
        if salt is not None:
            prompt["cache_salt"] = salt
        hits, ran = connector._scheduler.stats.hits, len(encoded)
        seen.clear()
        asked.clear()
        llm.generate(prompt, params, use_tqdm=False)
        report.append(
            {
                "image": index,
                "cache_salt": salt,
                "seen": seen[0],
                "asked": list(asked),
                "tier_hits": connector._scheduler.stats.hits - hits,
                "encoded": encoded[ran:],
            }
        )
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
