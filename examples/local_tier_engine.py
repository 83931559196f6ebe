"""Local-tier demo: one real vLLM engine (ec_both) serving requests with repeated images.

    .venv-vllm/bin/python examples/local_tier_engine.py     (the first half of `make demo`)

vLLM's own encoder cache is cut to 16 rows here (one image), as a busy server's would be full,
so repeated images come back from the connector's /dev/shm tier instead of the encoder.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

from vllm.v1.core.encoder_cache_manager import EncoderCacheManager  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class SmallEncoderCache(EncoderCacheManager):
    @classmethod
    def create_manager(cls, *, cache_size, vllm_config):  # noqa: ANN001, ANN206
        return cls(cache_size=int(vllm_config.ec_manager_config.manager_config["cache_size"]))


def main() -> int:
    import numpy as np
    from PIL import Image
    from vllm import LLM, SamplingParams

    sys.path.insert(0, str(ROOT / "tools"))
    from tiny_vlm import write_tiny_qwen2_vl

    model = write_tiny_qwen2_vl(Path(tempfile.mkdtemp(prefix="ec_local_")) / "m", random_weights=True, seed=0)
    engine_id = f"demo-local-{os.getpid()}"
    llm = LLM(
        model=str(model),
        distributed_executor_backend="uni",
        dtype="bfloat16",
        max_model_len=512,
        enforce_eager=True,
        enable_prefix_caching=False,
        limit_mm_per_prompt={"image": 2},
        ec_transfer_config={
            "ec_connector": "ECTierConnector",
            "ec_role": "ec_both",
            "engine_id": engine_id,
            "ec_connector_extra_config": {"ec_cpu_bytes": 12 << 10},
        },
        ec_manager_config={
            "encoder_cache_manager_cls": "__main__.SmallEncoderCache",
            "manager_config": {"cache_size": 16},
        },
    )
    sizes = [(100, 80), (112, 112), (56, 56), (84, 112), (112, 56), (70, 98)]
    pool = [
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8))
        for i, (w, h) in enumerate(sizes)
    ]
    rng = np.random.default_rng(7)
    workload = [list(rng.choice(len(pool), size=rng.integers(1, 3))) for _ in range(24)]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    started = time.perf_counter()
    for request in workload:
        content = [{"type": "image_pil", "image_pil": pool[i]} for i in request]
        content.append({"type": "text", "text": "Describe."})
        llm.chat([{"role": "user", "content": content}], params, use_tqdm=False)
    wall = time.perf_counter() - started
    tier = llm.llm_engine.engine_core.engine_core.scheduler.ec_connector._scheduler
    stats, occ = tier.stats, tier.occupancy()
    items = sum(len(r) for r in workload)
    print(f"local tier demo: {len(workload)} requests, {items} images ({len(pool)} distinct), {wall:.1f} s")
    print(f"  tier lookups       {stats.hits} hits, {stats.misses} misses (on vLLM's own cache misses)")
    print(
        f"  encoder runs       {stats.saves_planned} (each offloaded), {stats.loads_done} avoided by reloads"
    )
    print(f"  bytes              {stats.bytes_saved} saved to /dev/shm, {stats.bytes_loaded} reloaded")
    print(f"  evictions          {stats.evictions} (FIFO; tier of {occ.capacity_bytes} bytes)")
    del llm
    left = sorted(Path("/dev/shm").glob(f"vllm_ec_{engine_id}_dp*.mmap"))
    print(f"  region files left  {len(left)}")
    return 0 if stats.loads_done > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
