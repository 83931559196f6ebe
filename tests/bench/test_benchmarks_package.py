"""The benchmarks ship inside the package (ec_connector.benchmarks); bench/ keeps thin scripts.

Importing any shipped benchmark needs only the package's own dependencies (vLLM, matplotlib and
NIXL are imported where they are used), and the checkout's `python bench/<name>.py` and the
research benches' `from bench.<name> import ...` reach the same code.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import ec_connector.benchmarks

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("vllm", "matplotlib", "nixl")


def test_importing_every_shipped_benchmark_loads_no_vllm_matplotlib_or_nixl() -> None:
    names = [m.name for m in pkgutil.iter_modules(ec_connector.benchmarks.__path__)]
    assert {"copy_bandwidth", "compare_cache", "p2p", "serving", "serving_engine"} <= set(names)
    code = (
        "import importlib, json, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module('ec_connector.benchmarks.' + name)\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_research_benches_import_the_shipped_code_through_bench() -> None:
    sys.path.insert(0, str(ROOT))
    from bench import cache_traces, copy_bandwidth
    from ec_connector.benchmarks import cache_traces as shipped_traces
    from ec_connector.benchmarks import placements

    assert copy_bandwidth.aged is placements.aged and copy_bandwidth.Device is not None
    assert cache_traces.make_trace is shipped_traces.make_trace


def test_the_bench_scripts_still_run_from_a_checkout() -> None:
    for script, args in (("compare_cache.py", ["--help"]), ("serving.py", ["run", "--help"])):
        out = subprocess.run(
            [sys.executable, str(ROOT / "bench" / script), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert "usage:" in out.stdout


def test_the_serving_bench_copies_its_hook_and_finds_the_package_from_its_engine_children(
    tmp_path: Path,
) -> None:
    """The engine child runs `python -m ec_connector.benchmarks.serving_engine`: the hook folder comes
    first on its PYTHONPATH, then the folder holding this package (here, a source checkout)."""
    from ec_connector.benchmarks import serving_children, serving_hook

    env = serving_children.child_env(tmp_path)
    path = env["PYTHONPATH"].split(":")
    assert path[0] == str(tmp_path) and env[serving_hook.HOOK_DIR_ENV] == str(tmp_path)
    assert str(Path(ec_connector.benchmarks.__file__).resolve().parents[2]) in path
    code = "import ec_connector.benchmarks.serving_engine as m; print(m.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
