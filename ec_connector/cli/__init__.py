"""`ec-connector`: the command line (a driving adapter, like the vLLM facade).

User mistakes end with a one-line error and exit code 2; failures of the tool itself exit 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ec_connector.domain.errors import ECConnectorError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ec-connector",
        description="Encoder-cache connector for vLLM: a /dev/shm CPU tier and P2P transfer.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="run the demo: real vLLM engines (or --synthetic: the tier alone, no vLLM)",
        description=(
            "Without --synthetic: the README's demo on real vLLM engines (a tiny random-weight "
            "Qwen2-VL): one ec_both engine reloading repeated images from the /dev/shm tier, then an "
            "encoder-only producer server and a consumer server pulling its encodings over NIXL. "
            "With --synthetic: drive the tier's scheduler and worker services the way vLLM's hooks "
            "do, without vLLM: a stream of requests with repeated images; misses run a CPU 'vision "
            "encoder', hits reload from a real /dev/shm region, each reload compared with a fresh "
            "encoding."
        ),
    )
    demo.add_argument("--synthetic", action="store_true", help="simulated engine, no vLLM needed")
    demo.add_argument(
        "--part",
        dest="parts",
        action="append",
        choices=("local", "p2p"),
        help="real-engine demo: run only this part (repeatable; default both)",
    )
    demo.add_argument("--vllm-python", help="real-engine demo: interpreter with vLLM (default .venv-vllm)")
    synthetic = demo.add_argument_group("--synthetic options")
    synthetic.add_argument("--requests", type=_positive, default=None, help="requests to serve (48)")
    synthetic.add_argument("--images", type=_positive, default=None, help="distinct images (16)")
    synthetic.add_argument("--cpu-mib", type=_positive, default=None, help="tier size in MiB (3)")
    synthetic.add_argument("--seed", type=int, default=None, help="workload seed (0)")
    synthetic.add_argument("--shm-dir", default=None, help="where the region file lives (/dev/shm)")
    synthetic.add_argument("--json-logs", action="store_true", help="render logs as JSON")
    synthetic.add_argument("-v", "--verbose", action="store_true", help="log every tier event")
    from ec_connector.cli.bench import add_parser as add_bench
    from ec_connector.cli.regions import add_parser as add_regions

    add_regions(sub)
    add_bench(sub)
    return parser


SYNTHETIC_DEFAULTS = {"requests": 48, "images": 16, "cpu_mib": 3, "seed": 0, "shm_dir": "/dev/shm"}


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not > 0")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            given = [k for k in SYNTHETIC_DEFAULTS if getattr(args, k) is not None]
            if args.synthetic:
                from ec_connector.cli.demo import run_demo

                for key, value in SYNTHETIC_DEFAULTS.items():
                    if getattr(args, key) is None:
                        setattr(args, key, value)
                return run_demo(args)
            if given or args.json_logs or args.verbose:
                flags = ", ".join("--" + k.replace("_", "-") for k in given) or "--json-logs/--verbose"
                parser.error(f"demo: {flags} apply to --synthetic only")
            from ec_connector.cli.engines_demo import run_engines_demo

            return run_engines_demo(args)
        if args.command == "regions":
            from ec_connector.cli.regions import run_regions

            return run_regions(args)
        if args.command == "bench":
            from ec_connector.cli.bench import run_bench

            return run_bench(args)
    except (ECConnectorError, ValueError) as err:
        print(f"ec-connector {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
