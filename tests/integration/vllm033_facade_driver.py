"""The facade's scheduler side driven by vLLM 0.33's own objects, with no engine; prints one JSON line.

    PYTHONPATH=.venv-vllm033 VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/python \\
        tests/integration/vllm033_facade_driver.py MODEL_DIR ENGINE_ID

Run by tests/integration/test_vllm033_facade.py under the overlay that tools/setup_vllm033_overlay.sh
builds (vLLM 0.33's Python tree on .venv-vllm's torch). `MODEL_DIR` is a config-only tiny Qwen2-VL
(tools/tiny_vlm.py). What it does, with vLLM 0.33's classes throughout:

- `VllmConfig` / `ECTransferConfig` of an `ec_both` instance; `ECConnectorFactory` builds the
  connector from `ec_connector_module_path` and, after vLLM's plugin loader ran, from the plugin name;
  a producer whose measured encoder widths disagree with the model's row is refused at creation;
- vLLM's `Scheduler` (its KV-cache manager over a fake block pool, its encoder-cache manager) owns the
  scheduler-role connector and calls its hooks; a worker-role connector in this process plays the
  model runner's part: binds each step's metadata, saves the encoder output it "computed", loads
  what the plan asks into an encoder-cache dict. The region is a real /dev/shm file;
- image A is encoded and saved, fillers push it out of vLLM's own encoder cache, and A again must be
  a tier hit: loaded, not encoded; a last image B (a miss) closes the run;
- a NIXL producer's request_finished publishes an item that 0.33's processor made, with its metadata;
- the stats each step's `SchedulerStats` carries go through vLLM's `ECConnectorLogging` (aggregate,
  reduce, its log line) and `ECConnectorProm` (our Prometheus series).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections import Counter
from typing import Any

import torch
import vllm
from vllm.config import (
    CacheConfig,
    ECTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.distributed import parallel_state
from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
from vllm.distributed.ec_transfer.ec_connector.metrics import ECConnectorLogging, ECConnectorProm
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.platforms import current_platform
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from ec_connector.domain.errors import ConfigError
from ec_connector.entrypoints.vllm.compat import is_supported, measured_encoder_widths

HIDDEN = 128  # tools/tiny_vlm.py's tiny shape: the tier's row width
ROWS = 12  # image tokens of one item
BLOCK = 16
MODULE_PATH = "ec_connector.entrypoints.vllm"
# <|im_start|> <|vision_start|> 12 x <|image_pad|> <|vision_end|> <|im_end|>
PROMPT = [1, 3, *[6] * ROWS, 4, 2]
HOOKS = (
    "ensure_cache_available",
    "has_cache_item",
    "update_state_after_alloc",
    "build_connector_meta",
    "request_finished",
    "get_ec_connector_stats",
    "take_unavailable_requests",
)


def vllm_config(model_dir: str, engine_id: str, role: str = "ec_both", **ec: Any) -> VllmConfig:
    # one prompt (16 tokens) per step; an image item per prompt and no video, as the tests' engines run
    model = ModelConfig(
        model=model_dir, dtype="bfloat16", max_model_len=512, limit_mm_per_prompt={"image": 1, "video": 0}
    )
    cache = CacheConfig(block_size=BLOCK)
    cache.num_gpu_blocks = 64  # what the engine core sets once it has sized the KV cache
    scheduler = SchedulerConfig(
        max_num_batched_tokens=len(PROMPT), max_num_seqs=4, max_model_len=512, is_encoder_decoder=False
    )
    transfer = ECTransferConfig(
        ec_connector="ECTierConnector",
        ec_role=role,
        engine_id=engine_id,
        ec_connector_extra_config={"ec_cpu_bytes": 1 << 20},
        **ec,
    )
    return VllmConfig(
        model_config=model, cache_config=cache, scheduler_config=scheduler, ec_transfer_config=transfer
    )


def request(request_id: str, identifier: str) -> Request:
    feature = MultiModalFeatureSpec(
        data=None,  # the item is already processed: what the engine core gets for a cached item
        modality="image",
        identifier=identifier,
        mm_position=PlaceholderRange(offset=2, length=ROWS),
    )
    return Request(
        request_id=request_id,
        prompt_token_ids=list(PROMPT),
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        mm_features=[feature],
    )


def count_hooks(connector: Any, calls: Counter[str]) -> None:
    """Count the scheduler's calls of each hook on this instance (the hooks still run)."""
    for name in HOOKS:
        hook = getattr(connector, name)

        def counted(*args: Any, _hook: Any = hook, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _hook(*args, **kwargs)

        setattr(connector, name, counted)


def refusal(model_dir: str, engine_id: str) -> str | None:
    """The message a producer gets when vLLM measured widths other than the model's row width."""
    config = vllm_config(model_dir, engine_id, role="ec_producer", ec_connector_module_path=MODULE_PATH)
    config.ec_transfer_config.mm_encoder_output_widths = {"image": HIDDEN // 2}
    try:
        ECConnectorFactory.create_connector(config, ECConnectorRole.SCHEDULER).shutdown()
    except ConfigError as err:
        return str(err)
    return None


def by_plugin_name(model_dir: str, engine_id: str) -> str:
    """The class vLLM builds from the name alone once its plugin loader ran our entry point."""
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    config = vllm_config(model_dir, engine_id)  # no ec_connector_module_path
    connector = ECConnectorFactory.create_connector(config, ECConnectorRole.SCHEDULER)
    connector.shutdown()
    return f"{type(connector).__module__}.{type(connector).__name__}"


def producer_publishes(model_dir: str, engine_id: str) -> dict[str, Any]:
    """What a NIXL producer's request_finished hands vLLM for an item vLLM 0.33's own processor made
    (its dummy image: processed pixels and the grid metadata a consumer needs)."""
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.encoder_budget import MultiModalBudget

    os.environ["VLLM_EC_SIDE_CHANNEL_PORT"] = str(_free_port())
    config = vllm_config(model_dir, engine_id, role="ec_producer", ec_connector_module_path=MODULE_PATH)
    config.ec_transfer_config.ec_connector_extra_config["ec_enable_nixl"] = True
    config.ec_transfer_config.mm_encoder_output_widths = {"image": HIDDEN}  # as vLLM measures it
    budget = MultiModalBudget(config, MULTIMODAL_REGISTRY, enable_cache=False)
    dummy = budget.processor.get_dummy_mm_inputs(mm_counts={"image": 1})
    feature = MultiModalFeatureSpec(
        data=dummy["mm_kwargs"]["image"][0],
        modality="image",
        identifier="image-p",
        mm_position=dummy["mm_placeholders"]["image"][0],
    )
    req = Request(
        request_id="req-p",
        prompt_token_ids=list(dummy["prompt_token_ids"]),
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        mm_features=[feature],
    )
    connector = ECConnectorFactory.create_connector(config, ECConnectorRole.SCHEDULER)
    try:
        connector.ensure_cache_available(req, 0)
        connector.update_state_after_alloc(req, 0)
        plan = connector.build_connector_meta(None).plan  # the facade does not read the argument
        delay_free, params = connector.request_finished(req)
    finally:
        connector.shutdown()
    return {
        "rows": feature.mm_position.get_num_embeds(),
        "saves": [(c.key, c.rows) for c in plan.saves],
        "delay_free": delay_free,
        "params": params,
    }


def run_scheduler(config: VllmConfig) -> dict[str, Any]:
    kv = KVCacheConfig(
        num_blocks=64,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer.0"], FullAttentionSpec(BLOCK, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
            )
        ],
    )
    scheduler = Scheduler(config, kv, StructuredOutputManager(config), block_size=BLOCK, log_stats=True)
    calls: Counter[str] = Counter()
    count_hooks(scheduler.ec_connector, calls)
    worker = ECConnectorFactory.create_connector(config, ECConnectorRole.WORKER)
    outputs: dict[str, torch.Tensor] = {}  # identifier -> the encoder output the "model runner" made
    # enough other images to push image A out of vLLM's own encoder cache
    fillers = scheduler.encoder_cache_manager.cache_size // ROWS + 1
    # then image B: its step's stats carry the completion of A's load (reported one step later)
    order = ["image-a", *(f"filler-{i}" for i in range(fillers)), "image-a", "image-b"]
    steps, stats = [], []
    for n, identifier in enumerate(order):
        request_id = f"req-{n}"
        scheduler.add_request(request(request_id, identifier))
        out = scheduler.schedule()
        meta = out.ec_connector_metadata
        worker.bind_connector_metadata(meta)
        cache: dict[str, torch.Tensor] = {}
        worker.start_load_caches(cache)
        encoded = out.scheduled_encoder_inputs.get(request_id, [])
        if encoded:  # the model runner encoded the item: hand its output to the connector
            outputs.setdefault(identifier, torch.randn(ROWS, HIDDEN, dtype=torch.bfloat16))
            worker.save_caches({identifier: outputs[identifier]}, identifier)
        worker.get_finished(set())
        worker.clear_connector_metadata()
        result = scheduler.update_from_output(
            out,
            ModelRunnerOutput(req_ids=[request_id], req_id_to_index={request_id: 0}, sampled_token_ids=[[7]]),
        )
        finished = [o for engine in result.values() for o in engine.outputs if o.finish_reason is not None]
        for engine in result.values():
            if engine.scheduler_stats is not None and engine.scheduler_stats.ec_connector_stats:
                stats.append(engine.scheduler_stats.ec_connector_stats)
        steps.append(
            {
                "identifier": identifier,
                "encoded": encoded,
                "saves": [c.key for c in meta.plan.saves],
                "loads": [c.key for c in meta.plan.loads],
                "loaded": {k: bool(torch.equal(v.cpu(), outputs[k])) for k, v in cache.items()},
                "finished": [o.request_id for o in finished],
                "ec_transfer_params": [o.ec_transfer_params for o in finished],
            }
        )
    scheduler.shutdown()
    worker.shutdown()
    return {"steps": steps, "stats": stats, "hook_calls": dict(calls)}


def through_vllm_stats(config: VllmConfig, stats: list[dict[str, Any]]) -> dict[str, Any]:
    """The frontend's side: vLLM's logger aggregates and reduces the dicts; its Prometheus logger
    hands them to our series."""
    logging = ECConnectorLogging(config.ec_transfer_config)
    for data in stats:
        logging.observe(data)
    accumulated = logging.transfer_stats_accumulator
    reduced = accumulated.reduce() if accumulated is not None else None
    lines: list[str] = []
    logging.log(log_fn=lambda fmt, *args: lines.append(fmt % args))
    prom = ECConnectorProm(
        config, labelnames=["model_name", "engine"], per_engine_labelvalues={0: ["tiny", "0"]}
    )
    for data in stats:
        prom.observe(data, engine_idx=0)
    from prometheus_client import REGISTRY

    samples = {
        s.name: s.value
        for metric in REGISTRY.collect()
        for s in metric.samples
        if s.name in ("vllm:ec_tier_hits_total", "vllm:ec_tier_loads_total", "vllm:ec_tier_saves_total")
    }
    return {
        "accumulated_type": type(accumulated).__name__,
        "reduced": reduced,
        "log_lines": lines,
        "prom_type": type(prom.prom_metrics).__name__,
        "prom": samples,
    }


def main(model_dir: str, engine_id: str) -> None:
    transfer = ECTransferConfig(ec_connector="ECTierConnector", ec_role="ec_producer")
    report: dict[str, Any] = {
        "version": vllm.__version__,
        "vllm_file": vllm.__file__,
        "supported": is_supported(vllm.__version__),
        "platform": type(current_platform).__name__,
        "widths_field": "mm_encoder_output_widths" in getattr(ECTransferConfig, "__dataclass_fields__", {}),
        "widths_before": measured_encoder_widths(type("C", (), {"ec_transfer_config": transfer})()),
        "refusal": refusal(model_dir, f"{engine_id}-refused"),
        "by_plugin": by_plugin_name(model_dir, f"{engine_id}-plugin"),
        "producer": producer_publishes(model_dir, f"{engine_id}-producer"),
    }
    config = vllm_config(model_dir, engine_id, ec_connector_module_path=MODULE_PATH)
    port = _free_port()
    with set_current_vllm_config(config):  # the worker-role connector reads its TP rank from vLLM's groups
        parallel_state.init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            local_rank=0,
            backend="gloo",
        )
        parallel_state.ensure_model_parallel_initialized(1, 1)
        try:
            report.update(run_scheduler(config))
        finally:
            parallel_state.destroy_model_parallel()
            parallel_state.destroy_distributed_environment()
    report.update(through_vllm_stats(config, report["stats"]))
    report["compiled_vllm_modules"] = sorted(
        name
        for name, module in sys.modules.items()
        if name.startswith("vllm") and str(getattr(module, "__file__", "") or "").endswith(".so")
    )
    print(json.dumps(report, default=str))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
