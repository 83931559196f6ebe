"""Named profiler ranges around the connector's hooks, for finding where a step's time goes.

With `VLLM_EC_PROFILE_RANGES` set to "1", "true" or "yes" (any case) in the engine's environment,
each hook vLLM calls on an instance runs inside `ec_tier.<hook>`: a `torch.profiler` range (it shows
in vLLM's torch-profiler traces) and, where CUDA is available, an NVTX range (it shows in Nsight
Systems timelines). Off by default: the ranges cost a few microseconds a call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

ENV = "VLLM_EC_PROFILE_RANGES"

SCHEDULER_HOOKS = (
    "has_cache_item",
    "ensure_cache_available",
    "take_unavailable_requests",
    "update_state_after_alloc",
    "build_connector_meta",
    "request_finished",
    "has_pending_push_work",
    "get_ec_connector_stats",
)
"""The hooks vLLM calls on the scheduler's instance, each step or each request."""

WORKER_HOOKS = (
    "bind_connector_metadata",
    "start_load_caches",
    "save_caches",
    "get_finished",
    "clear_connector_metadata",
)
"""The hooks vLLM calls on each worker's instance, each step or each saved item."""


def enabled(environ: Mapping[str, str]) -> bool:
    return environ.get(ENV, "").strip().lower() in ("1", "true", "yes")


def wrap_hooks(instance: object, hooks: tuple[str, ...]) -> None:
    """Make each of `hooks` on `instance` run inside its range (the class is left as it is)."""
    nvtx = torch.cuda.is_available()
    for name in hooks:
        setattr(instance, name, ranged(f"ec_tier.{name}", getattr(instance, name), nvtx=nvtx))


def ranged(label: str, hook: Callable[..., Any], *, nvtx: bool) -> Callable[..., Any]:
    """`hook` inside a torch-profiler range named `label`, and an NVTX range when `nvtx`."""

    @functools.wraps(hook)
    def call(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(label):
            if not nvtx:
                return hook(*args, **kwargs)
            torch.cuda.nvtx.range_push(label)
            try:
                return hook(*args, **kwargs)
            finally:
                torch.cuda.nvtx.range_pop()

    return call
