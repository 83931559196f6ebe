"""The serving benchmark's in-engine hook: counts encoder items and, when switched on, stubs the encoder.

The serving bench (serving.py) copies this file as ``sitecustomize.py`` into a private folder that
it puts first on each engine child's PYTHONPATH, so every Python process of that engine (the driver, the
EngineCore, its workers) runs it at start. It does nothing unless ``EC_BENCH_HOOK_DIR`` names that
folder. Then, once vLLM's Qwen2-VL module is imported, its ``embed_multimodal`` (the call both of
vLLM's model runners make for a batch of images: the V1 runner and 0.33's V2 ``EncoderRunner``)
is wrapped so that:

- every call appends one line, its number of items and whether it was stubbed (``"12 0"``), to
  ``encoder.<engine>.<pid>`` in that folder
  (<engine> is ``EC_BENCH_ENGINE`` as the process inherited it, ``engine`` by default: E→PD runs
  two engines; the bench sums the lines before and after each pass: encoder items run);
- while a file ``stub_on`` exists in that folder, the call returns slices of one pre-made tensor
  of the right shape (rows = t·h·w / merge², width = the text hidden size) instead of running the
  vision tower: the encoder's work removed, the floor no tier can beat (the "limit" workload).

It also times the EC connector's hooks, ours and vLLM's ECCPUConnector alike: every method a
connector class defines (and the base class's hooks it inherits) is wrapped with a wall-clock
timer, and a daemon thread writes each process's running totals, ``{method: [calls, seconds]}``,
to ``hooks.<engine>.<pid>`` every ``DUMP_INTERVAL_S`` (the bench reads them before and after
each pass: the host time the step spends in the connector, side by side).

Stdlib only at import (torch is imported on the first stubbed call). The hook must never break
the engine: a stub that cannot work out the shapes runs the real encoder.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import threading
from typing import Any

HOOK_DIR_ENV = "EC_BENCH_HOOK_DIR"
ENGINE_ENV = "EC_BENCH_ENGINE"
STUB_FLAG = "stub_on"
COUNT_PREFIX = "encoder."
HOOKS_PREFIX = "hooks."
DUMP_INTERVAL_S = 0.2
MODEL_MODULE = "vllm.model_executor.models.qwen2_vl"
# The connector classes whose hooks are timed, by the module that defines them (ours under its
# entry-point path and its older adapter path).
CONNECTORS = {
    "ec_connector.entrypoints.vllm.connector": ("ECTierConnector",),
    "ec_connector.adapters.vllm.connector": ("ECTierConnector",),
    "vllm.distributed.ec_transfer.ec_connector.cpu.connector": ("ECCPUConnector",),
}
TARGETS = {MODEL_MODULE: ("Qwen2VLForConditionalGeneration",), **CONNECTORS}
# 0.32 and 0.33 name the encoder entry point embed_multimodal; older trees get_multimodal_embeddings.
METHODS = ("embed_multimodal", "get_multimodal_embeddings")
# Hooks vLLM calls on a connector; a class is timed on those it defines or inherits from the base.
CONNECTOR_HOOKS = (
    "bind_connector_metadata", "clear_connector_metadata", "start_load_caches", "save_caches",
    "start_save_caches", "get_finished", "build_connector_worker_meta", "get_ec_connector_stats",
    "has_cache_item", "ensure_cache_available", "take_unavailable_requests", "update_state_after_alloc",
    "update_state_after_free", "build_connector_meta", "update_connector_output", "request_finished",
    "has_pending_push_work",
)  # fmt: skip

_lock = threading.Lock()
_premade: dict[tuple[Any, Any, int], Any] = {}
_hook_totals: dict[str, list[float]] = {}
_dumper: list[threading.Thread] = []


def _record(hook_dir: str, items: int, stubbed: bool) -> None:
    """Append one call's line, "<items> <1 if stubbed else 0>": append-only, one writer per file."""
    name = f"{COUNT_PREFIX}{os.environ.get(ENGINE_ENV, 'engine')}.{os.getpid()}"
    with _lock, open(os.path.join(hook_dir, name), "a") as f:
        f.write(f"{items} {int(stubbed)}\n")


def _grid_rows(kwargs: dict[str, Any], merge: int) -> list[int] | None:
    grid = kwargs.get("image_grid_thw")
    if grid is None or kwargs.get("pixel_values_videos") is not None:
        return None
    rows = grid.tolist() if hasattr(grid, "tolist") else [list(g) for g in grid]
    if rows and not isinstance(rows[0], list | tuple):
        rows = [rows]
    return [int(t) * int(h) * int(w) // (merge * merge) for t, h, w in rows]


def _stub(model: Any, kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """Slices of one pre-made tensor shaped like the encoder's outputs, or None (run the encoder)."""
    import torch

    config = model.config
    vision = getattr(config, "vision_config", None)
    merge = int(getattr(vision, "spatial_merge_size", 2))
    text = getattr(config, "text_config", None) or config
    hidden = int(getattr(text, "hidden_size", 0) or getattr(config, "hidden_size", 0))
    counts = _grid_rows(kwargs, merge)
    if not counts or hidden <= 0:
        return None
    param = next(model.parameters())
    pixels = kwargs.get("pixel_values")
    device = pixels.device if isinstance(pixels, torch.Tensor) else param.device
    key = (device, param.dtype, hidden)
    buf = _premade.get(key)
    if buf is None or buf.shape[0] < max(counts):
        gen = torch.Generator().manual_seed(0)
        rows = max(counts) if buf is None else max(max(counts), 2 * buf.shape[0])
        buf = (torch.randn(rows, hidden, generator=gen) * 0.02).to(device=device, dtype=param.dtype)
        _premade[key] = buf
    return tuple(buf[:n] for n in counts)


def _wrap(cls: type, name: str, hook_dir: str) -> None:
    original = getattr(cls, name)
    flag = os.path.join(hook_dir, STUB_FLAG)

    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = None
        if not args and os.path.exists(flag):
            out = _stub(self, kwargs)
        stubbed = out is not None
        if out is None:
            out = original(self, *args, **kwargs)
        _record(hook_dir, len(out) if out is not None else 0, stubbed)
        return out

    hooked.__name__ = name
    hooked.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(cls, name, hooked)


def _time(cls: type, name: str, hook_dir: str) -> None:
    """Wrap `cls.name` with a wall-clock timer adding into this process's totals."""
    import time

    original = getattr(cls, name)
    perf = time.perf_counter

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = perf()
        try:
            return original(self, *args, **kwargs)
        finally:
            spent = perf() - t0
            rec = _hook_totals.get(name)
            if rec is None:
                rec = _hook_totals.setdefault(name, [0, 0.0])
            rec[0] += 1
            rec[1] += spent

    timed.__name__ = name
    timed.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(cls, name, timed)
    _start_dumper(hook_dir)


def _start_dumper(hook_dir: str) -> None:
    """One daemon thread per process writes the hook totals every DUMP_INTERVAL_S (atomic rename)."""
    with _lock:
        if _dumper:
            return
        path = os.path.join(hook_dir, f"{HOOKS_PREFIX}{os.environ.get(ENGINE_ENV, 'engine')}.{os.getpid()}")

        def dump() -> None:
            import json
            import time

            last = None
            while True:
                time.sleep(DUMP_INTERVAL_S)
                snapshot = {k: list(v) for k, v in list(_hook_totals.items())}
                if snapshot != last:
                    with open(path + ".tmp", "w") as f:
                        json.dump(snapshot, f)
                    os.replace(path + ".tmp", path)
                    last = snapshot

        thread = threading.Thread(target=dump, name="ec-bench-hook-dump", daemon=True)
        thread.start()
        _dumper.append(thread)


def patch_module(module: Any, hook_dir: str) -> list[str]:
    """Wrap the encoder entry points of the model classes in `module`, or time the hooks of the
    connector classes in it; returns what was wrapped."""
    done = []
    for cls_name in TARGETS.get(module.__name__, ()):
        cls = getattr(module, cls_name, None)
        if cls is None:
            continue
        if module.__name__ in CONNECTORS:
            for name in CONNECTOR_HOOKS:
                if callable(getattr(cls, name, None)) and not hasattr(getattr(cls, name), "__wrapped__"):
                    _time(cls, name, hook_dir)
                    done.append(f"{cls_name}.{name}")
            continue
        for name in METHODS:
            if name in vars(cls) and not hasattr(vars(cls)[name], "__wrapped__"):
                _wrap(cls, name, hook_dir)
                done.append(f"{cls_name}.{name}")
    return done


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: Any, hook_dir: str) -> None:
        self._inner = inner
        self._hook_dir = hook_dir

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        patch_module(module, self._hook_dir)


class _Finder(importlib.abc.MetaPathFinder):
    """Patches the target modules right after they are imported (they import torch and vLLM)."""

    def __init__(self, hook_dir: str) -> None:
        self._hook_dir = hook_dir

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in TARGETS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, self._hook_dir)
        return spec


def install(hook_dir: str) -> None:
    for name in TARGETS:
        if name in sys.modules:
            patch_module(sys.modules[name], hook_dir)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(hook_dir))


def _chain_next_sitecustomize() -> None:
    """Run the sitecustomize this file shadows (the next one on sys.path), if there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        candidate = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.abspath(entry or ".") == here or not os.path.isfile(candidate):
            continue
        with open(candidate) as f:
            code = compile(f.read(), candidate, "exec")
        exec(code, {"__name__": "sitecustomize_chained", "__file__": candidate})
        return


if __name__ == "sitecustomize":
    _hook_dir = os.environ.get(HOOK_DIR_ENV)
    if _hook_dir:
        install(_hook_dir)
    _chain_next_sitecustomize()
