"""Local-tier demo: one real vLLM engine (ec_both) serving requests with repeated images.

    .venv-vllm/bin/python examples/local_tier_engine.py [--log-dir DIR]   (the first half of `make demo`)

vLLM's own encoder cache is cut to 16 rows here (one image), as a busy server's would be full,
so repeated images come back from the connector's /dev/shm tier instead of the encoder. The
engine's own output (vLLM's log, warnings) goes to `local.log` in the log directory; the terminal
gets the demo's lines only.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from demo_output import story_and_log  # noqa: E402


def small_encoder_cache() -> type:
    """vLLM's encoder cache manager, sized from `manager_config["cache_size"]` instead of the model.

    Defined after the log is redirected, because importing vLLM already logs; published as
    `__main__.SmallEncoderCache`, the name the engine config gives.
    """
    from vllm.v1.core.encoder_cache_manager import EncoderCacheManager

    class SmallEncoderCache(EncoderCacheManager):
        @classmethod
        def create_manager(cls, *, cache_size, vllm_config):  # noqa: ANN001, ANN206
            return cls(cache_size=int(vllm_config.ec_manager_config.manager_config["cache_size"]))

    globals()["SmallEncoderCache"] = SmallEncoderCache
    return SmallEncoderCache


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-dir", type=Path, default=None, help="where local.log goes (a new temp dir)")
    args = parser.parse_args()
    log = (args.log_dir or Path(tempfile.mkdtemp(prefix="ec_demo_"))) / "local.log"
    say = story_and_log(log)
    try:
        return run(say, log)
    except BaseException as exc:
        print(f"  failed: {exc!r}; the traceback and vLLM's log are in {log}", file=say)
        raise


def run(say: TextIO, log: Path) -> int:
    import numpy as np
    from PIL import Image

    sys.path.insert(0, str(ROOT / "tools"))
    from tiny_vlm import write_tiny_qwen2_vl

    small_encoder_cache()
    from vllm import LLM, SamplingParams

    model = write_tiny_qwen2_vl(Path(tempfile.mkdtemp(prefix="ec_local_")) / "m", random_weights=True, seed=0)
    engine_id = f"demo-local-{os.getpid()}"
    print(f"  starting the engine (vLLM's log: {log})", file=say)
    started = time.perf_counter()
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
    items = sum(len(r) for r in workload)
    print(
        f"  engine ready in {time.perf_counter() - started:.0f} s; sending {len(workload)} chat requests "
        f"with {items} images ({len(pool)} distinct)",
        file=say,
    )
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    started = time.perf_counter()
    for request in workload:
        content = [{"type": "image_pil", "image_pil": pool[i]} for i in request]
        content.append({"type": "text", "text": "Describe."})
        llm.chat([{"role": "user", "content": content}], params, use_tqdm=False)
    wall = time.perf_counter() - started
    tier = llm.llm_engine.engine_core.engine_core.scheduler.ec_connector._scheduler
    stats, occ = tier.stats, tier.occupancy()
    lines = [
        f"  served in {wall:.1f} s:",
        f"    tier lookups       {stats.hits} hits, {stats.misses} misses (on vLLM's own cache misses)",
        f"    encoder runs       {stats.saves_planned} (each offloaded), "
        f"{stats.loads_done} avoided by reloads",
        f"    bytes              {stats.bytes_saved} saved to /dev/shm, {stats.bytes_loaded} reloaded",
        f"    evictions          {stats.evictions} (tier of {occ.capacity_bytes} bytes)",
    ]
    print("\n".join(lines), file=say)
    del llm
    left = sorted(Path("/dev/shm").glob(f"vllm_ec_{engine_id}_dp*.mmap"))
    print(f"  engine stopped; region files left in /dev/shm: {len(left)}", file=say)
    return 0 if stats.loads_done > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
