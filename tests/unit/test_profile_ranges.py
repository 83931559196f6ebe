"""Profiler ranges around the connector's hooks (ec_connector/adapters/profile_ranges.py): each
wrapped hook shows in a real torch-profiler trace under its `ec_tier.<hook>` name, keeps its
result and its exceptions; the switch is VLLM_EC_PROFILE_RANGES. (That the hook names are vLLM's
own is checked against the installed vLLM in tests/integration/test_profile_ranges_vllm.py.)"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from ec_connector.adapters import profile_ranges as ranges


class Hooks:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def ensure_cache_available(self, request: str, computed: int) -> bool:
        self.calls.append(request)
        return computed > 0

    def build_connector_meta(self, output: object) -> str:
        raise RuntimeError("refused")


def test_each_wrapped_hook_runs_inside_its_named_range() -> None:
    hooks = Hooks()
    ranges.wrap_hooks(hooks, ("ensure_cache_available", "build_connector_meta"))
    with profile(activities=[ProfilerActivity.CPU]) as trace:
        assert hooks.ensure_cache_available("req-1", 3) is True
        assert hooks.ensure_cache_available("req-2", 0) is False
        with pytest.raises(RuntimeError, match="refused"):
            hooks.build_connector_meta(None)
    names = [event.name for event in trace.events()]
    assert names.count("ec_tier.ensure_cache_available") == 2
    assert names.count("ec_tier.build_connector_meta") == 1
    assert hooks.calls == ["req-1", "req-2"]
    assert Hooks.ensure_cache_available.__name__ == "ensure_cache_available"  # the class is untouched
    assert "ec_tier" not in repr(Hooks().ensure_cache_available)


def test_an_unwrapped_hook_leaves_no_range() -> None:
    hooks = Hooks()
    with profile(activities=[ProfilerActivity.CPU]) as trace:
        hooks.ensure_cache_available("req-1", 1)
    assert not [event.name for event in trace.events() if event.name.startswith("ec_tier.")]


@pytest.mark.parametrize(
    ("value", "on"), [("1", True), ("TRUE", True), ("yes", True), ("0", False), ("", False)]
)
def test_the_switch_is_vllm_ec_profile_ranges(value: str, on: bool) -> None:
    assert ranges.enabled({ranges.ENV: value}) is on
    assert ranges.enabled({}) is False


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for NVTX ranges")
def test_with_cuda_the_hook_also_runs_inside_an_nvtx_range() -> None:
    hooks = Hooks()
    ranges.wrap_hooks(hooks, ("ensure_cache_available",))
    depth = torch.cuda.nvtx.range_push("outer")
    assert hooks.ensure_cache_available("req-1", 1) is True
    assert torch.cuda.nvtx.range_pop() == depth  # the hook's range was popped: back at "outer"
