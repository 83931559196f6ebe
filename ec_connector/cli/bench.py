"""`ec-connector bench copy|cache|p2p|serving`: run one of the benchmarks the package ships
(`ec_connector.benchmarks`), in this interpreter.

`copy`, `cache` and `p2p` show a progress line on stderr and write `<out>/<kind>.json` with every
figure and `<out>/<kind>.png` (matplotlib: the `bench` extra). `serving` takes the serving bench's
own `run` / `report` commands and options. Baselines that need a package this environment lacks
say so: `cache` without vLLM runs our table alone (its default policy and `fifo`) and records why
vLLM's column was skipped; `p2p` needs NIXL.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ec_connector.domain.errors import ECConnectorError

KINDS = {
    "copy": "TorchCopier save/load GB/s against a same-run contiguous pinned memcpy (CUDA if present)",
    "p2p": "ZMQ ack + NIXL READ between two processes on this host against a plain copy (needs nixl)",
    "cache": "our entry table (default policy and fifo) against vLLM's in-tree EmbeddingCache when "
    "vLLM is installed",
    "serving": "end-to-end vLLM engines: no connector, vLLM's ECCPUConnector and ours, side by side "
    "(needs vllm; `bench serving run --help`)",
}
Result = tuple[dict[str, Any], Callable[[dict[str, Any], Path], None]]


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench",
        help="run a benchmark and write its figures (JSON) and a plot (PNG)",
        description="Run one of the benchmarks shipped in ec_connector.benchmarks. "
        + " ".join(f"{k}: {v}." for k, v in KINDS.items()),
    )
    kinds = bench.add_subparsers(dest="kind", required=True, metavar="KIND")
    for kind in ("copy", "cache", "p2p"):
        one = kinds.add_parser(
            kind,
            help=KINDS[kind],
            description=f"{KINDS[kind]}. Writes <out>/{kind}.json and <out>/{kind}.png.",
        )
        one.add_argument("--quick", action="store_true", help="a short run (fewer cases and repetitions)")
        one.add_argument(
            "--out", type=Path, default=Path("bench-results"), help="output folder (bench-results)"
        )
    from ec_connector.benchmarks import serving

    serving.add_commands(kinds.add_parser("serving", help=KINDS["serving"], description=serving.__doc__))


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
    if args.kind == "serving":
        return int(args.func(args))
    if importlib.util.find_spec("matplotlib") is None:
        raise ECConnectorError(
            "ec-connector bench writes a PNG and needs matplotlib: pip install 'ec-connector[bench]'"
        )
    runners: dict[str, Callable[[bool], Result]] = {"copy": _copy, "p2p": _p2p, "cache": _cache}
    args.out.mkdir(parents=True, exist_ok=True)
    result, plot = runners[args.kind](args.quick)
    json_path, png_path = args.out / f"{args.kind}.json", args.out / f"{args.kind}.png"
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, png_path)
    print(f"wrote {json_path} and {png_path}")
    return 0


def _copy(quick: bool) -> Result:
    from ec_connector.benchmarks import copy_bandwidth, plots

    options = copy_bandwidth.parse_args(["--quick"] if quick else [])
    progress = Progress("copy", copy_bandwidth.cases(options))
    try:
        return copy_bandwidth.run(options, progress), plots.copy
    finally:
        progress.close()


def _p2p(quick: bool) -> Result:
    if importlib.util.find_spec("nixl") is None:
        raise ECConnectorError(
            "ec-connector bench p2p needs NIXL: pip install 'ec-connector[nixl]' (or --no-deps -r "
            "requirements/p2p.txt in a checkout)"
        )
    from ec_connector.benchmarks import p2p, plots

    progress = Progress("p2p", None)
    try:
        return p2p.run(p2p.SIZES_MIB, p2p.MODES, progress=progress, **p2p.presets(quick)), plots.p2p
    finally:
        progress.close()


def _cache(quick: bool) -> Result:
    from ec_connector.benchmarks import compare_cache

    progress = Progress("cache", None)
    try:
        result = compare_cache.run(quick=quick, progress=progress)
    finally:
        progress.close()
    if result.get("vllm_skipped"):
        print(
            f"bench cache: vLLM's EmbeddingCache column skipped ({result['vllm_skipped']}); "
            "install vllm in this environment to compare against it",
            file=sys.stderr,
        )
    return result, lambda res, path: compare_cache.plot(res, str(path))
