"""`ec-connector bench copy|p2p|cache`: run a benchmark from bench/, write its JSON and a PNG plot.

The benchmarks live in the source checkout's bench/ folder (they are measurement scripts, not part
of the installed package); this command finds them beside the package, runs one with a progress
line on stderr, and writes `<out>/<kind>.json` and `<out>/<kind>.png`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ec_connector.domain.errors import ECConnectorError

KINDS = {
    "copy": "TorchCopier save/load GB/s against a same-run contiguous pinned memcpy (CUDA if present)",
    "p2p": "ZMQ ack + NIXL READ between two processes on this host against a plain copy (needs nixl)",
    "cache": "our entry table against vLLM's in-tree EmbeddingCache on one recorded trace (needs vLLM)",
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench",
        help="run a benchmark and write its figures (JSON) and a plot (PNG)",
        description="Run one of the project's benchmarks (bench/ in the source checkout) and write "
        "<out>/<kind>.json with every figure and <out>/<kind>.png, ours beside the baseline. "
        + " ".join(f"{k}: {v}." for k, v in KINDS.items()),
    )
    bench.add_argument("kind", choices=sorted(KINDS), help="which benchmark")
    bench.add_argument("--quick", action="store_true", help="a short run (fewer cases and repetitions)")
    bench.add_argument(
        "--out", type=Path, default=Path("bench-results"), help="output folder (bench-results)"
    )


class Progress:
    """One status line on stderr: a bar when the number of steps is known, else a step count."""

    def __init__(self, kind: str, total: int | None) -> None:
        self.kind, self.total, self.done = kind, total, 0
        self.t0 = time.monotonic()
        self.tty = sys.stderr.isatty()

    def __call__(self, message: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.t0
        if self.total:
            filled = min(20, 20 * self.done // self.total)
            head = f"[{'#' * filled}{'.' * (20 - filled)}] {self.done}/{self.total}"
        else:
            head = f"[step {self.done}]"
        line = f"{self.kind} {head} {elapsed:5.0f}s  {message.strip()}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line[:150])
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


def run_bench(args: argparse.Namespace) -> int:
    root = _bench_on_path()
    if args.kind == "cache" and importlib.util.find_spec("vllm") is None:
        return _in_vllm_venv(root, args)
    plots = importlib.import_module("bench.plots")
    runners: dict[str, Callable[[bool], tuple[dict[str, Any], Callable[[dict[str, Any], Path], None]]]] = {
        "copy": lambda quick: (_copy(quick), plots.copy),
        "p2p": lambda quick: (_p2p(quick), plots.p2p),
        "cache": lambda quick: _cache(quick),
    }
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ECConnectorError(
            "ec-connector bench writes a PNG and needs matplotlib: pip install -r requirements/dev.txt"
        ) from None
    args.out.mkdir(parents=True, exist_ok=True)
    result, plot = runners[args.kind](args.quick)
    json_path, png_path = args.out / f"{args.kind}.json", args.out / f"{args.kind}.png"
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, png_path)
    print(f"wrote {json_path} and {png_path}")
    return 0


def _bench_on_path() -> Path:
    root = Path(__file__).resolve().parents[2]
    if not (root / "bench" / "plots.py").is_file():
        raise ECConnectorError(
            "ec-connector bench runs the benchmarks of a source checkout and found none at "
            f"{root / 'bench'}; run it from a clone of the repository (pip install -e .)"
        )
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return root


def _in_vllm_venv(root: Path, args: argparse.Namespace) -> int:
    """The cache comparison imports vLLM's EmbeddingCache: run it with the vLLM venv's interpreter."""
    python = root / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        raise ECConnectorError(
            "ec-connector bench cache compares against vLLM's EmbeddingCache and needs vLLM: build "
            f"{python.parent.parent} with tools/setup_vllm_env.sh (make test does), or install vllm here"
        )
    argv = [str(python), "-m", "ec_connector.cli", "bench", "cache", "--out", str(args.out)]
    return subprocess.call(argv + (["--quick"] if args.quick else []))


def _copy(quick: bool) -> dict[str, Any]:
    copy_bandwidth = importlib.import_module("bench.copy_bandwidth")
    options = copy_bandwidth.parse_args(["--quick"] if quick else [])
    progress = Progress("copy", copy_bandwidth.cases(options))
    try:
        return copy_bandwidth.run(options, progress)
    finally:
        progress.close()


def _p2p(quick: bool) -> dict[str, Any]:
    try:
        import nixl  # noqa: F401
    except ImportError:
        raise ECConnectorError(
            "ec-connector bench p2p needs NIXL: pip install --no-deps -r requirements/p2p.txt"
        ) from None
    p2p = importlib.import_module("bench.p2p")
    progress = Progress("p2p", None)
    try:
        return p2p.run(p2p.SIZES_MIB, p2p.MODES, progress=progress, **p2p.presets(quick))
    finally:
        progress.close()


def _cache(quick: bool) -> tuple[dict[str, Any], Callable[[dict[str, Any], Path], None]]:
    compare_cache = importlib.import_module("bench.compare_cache")
    progress = Progress("cache", None)
    try:
        result = compare_cache.run(quick=quick, progress=progress)
    finally:
        progress.close()
    if result.get("skipped"):
        raise ECConnectorError(
            f"ec-connector bench cache: the baseline is not available: {result['skipped']}"
        )
    return result, lambda res, path: compare_cache.plot(res, str(path))
