"""Translate a `VllmConfig` (and this process's place in the engine) into container settings.

The extra config arrives parsed (`container.parse_settings`, called once by the connector); these
functions add what the engine decides: the encoder row, the ranks, the instance, the side channel.
"""

from __future__ import annotations

import os
from typing import Any

from ec_connector.adapters.zmq_settings import side_channel_from_env
from ec_connector.container import Settings
from ec_connector.domain.errors import ConfigError
from ec_connector.domain.layout import DTYPE_ITEMSIZE, fingerprint, model_hidden_dim
from ec_connector.entrypoints.vllm.compat import check_row_width


def encoder_row(vllm_config: Any) -> tuple[int, str]:
    """(hidden_dim, dtype name) of one encoder-output row of the served model."""
    model_config = vllm_config.model_config
    hf_config = model_config.hf_config
    vision = getattr(hf_config, "vision_config", None)
    deepstack = tuple(getattr(vision, "deepstack_visual_indexes", None) or ())
    hidden = model_hidden_dim(
        model_config.get_hidden_size(),
        vision_out_hidden=getattr(vision, "out_hidden_size", None),
        deepstack_indexes=deepstack,
    )
    check_row_width(vllm_config, hidden)
    dtype = str(model_config.dtype).removeprefix("torch.")
    return hidden, dtype


def parallel_ranks(vllm_config: Any) -> int:
    """Worker processes of this engine instance that map the region: TP × PCP."""
    parallel = vllm_config.parallel_config
    if getattr(parallel, "pipeline_parallel_size", 1) != 1:
        raise ConfigError(
            "ECTierConnector supports pipeline_parallel_size = 1 only (got "
            f"{parallel.pipeline_parallel_size}); the encoder runs on the first stage"
        )
    pcp = getattr(parallel, "prefill_context_parallel_size", 1) or 1
    return parallel.tensor_parallel_size * pcp


def data_parallel_index(vllm_config: Any) -> int:
    """This engine's data-parallel rank. With data parallelism over a dense model (most VLMs) vLLM
    runs the ranks as independent engines and resets `data_parallel_rank` to 0 in each; the distinct
    rank stays in `data_parallel_index` (vLLM's own per-rank ports and event endpoints use it). Each
    rank needs its own region, NIXL agent, side-channel port and event feed."""
    parallel = vllm_config.parallel_config
    return int(getattr(parallel, "data_parallel_index", parallel.data_parallel_rank))


def base_settings(vllm_config: Any, config: Settings) -> dict[str, Any]:
    """Settings shared by the scheduler side and the worker side of one instance (`config`: its
    extra config, parsed)."""
    ec = vllm_config.ec_transfer_config
    hidden, dtype = encoder_row(vllm_config)
    ranks = parallel_ranks(vllm_config)
    dp_rank = data_parallel_index(vllm_config)
    p2p: dict[str, Any] = {}
    if config.tier.enable_nixl:
        import vllm

        p2p["fingerprint"] = fingerprint(
            vllm_version=vllm.__version__,
            model=str(vllm_config.model_config.model),
            dtype=dtype,
            block_size_bytes=hidden * DTYPE_ITEMSIZE[dtype],
        )
        if config.tier.role.saves:
            side = side_channel_from_env(os.environ).for_rank(dp_rank)
            p2p.update(side_host=side.host, side_port=side.port)
    return {
        **p2p,
        "instance": ec.engine_id,
        "dp_rank": dp_rank,
        "hidden_dim": hidden,
        "dtype": dtype,
        "ranks": ranks,
        "participants": ranks + 1,
    }


def scheduler_settings(vllm_config: Any, config: Settings) -> dict[str, Any]:
    return {
        **base_settings(vllm_config, config),
        "slot": 0,
        "rank": 0,
        "writer": False,
        "device": "cpu",
        # vLLM's encoder cache, in rows: what it may still hold of the items it allocated
        "encoder_cache_rows": int(vllm_config.scheduler_config.encoder_cache_size),
    }


def worker_settings(vllm_config: Any, config: Settings) -> dict[str, Any]:
    from vllm.distributed import parallel_state

    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tp_size = vllm_config.parallel_config.tensor_parallel_size
    pcp_rank = _pcp_rank(parallel_state)
    rank = pcp_rank * tp_size + tp_rank
    return {
        **base_settings(vllm_config, config),
        "slot": 1 + rank,
        "rank": rank,
        "writer": rank == 0,
        "device": _device(vllm_config),
    }


def _pcp_rank(parallel_state: Any) -> int:
    getter = getattr(parallel_state, "get_pcp_group", None)
    if getter is None:
        return 0
    try:
        return int(getter().rank_in_group)
    except AssertionError:  # the group is not initialised: no prefill context parallelism
        return 0


def _device(vllm_config: Any) -> str:
    device = vllm_config.device_config.device
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"
