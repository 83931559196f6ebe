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
        help="run the local CPU tier on a simulated encoder workload and show what it saved",
        description=(
            "Drive the tier's scheduler and worker services the way vLLM's hooks do: a stream of "
            "requests with repeated images; misses run a CPU 'vision encoder', hits reload from a "
            "real /dev/shm region. Every reloaded embedding is compared with a fresh encoding."
        ),
    )
    demo.add_argument("--synthetic", action="store_true", help="simulated engine (the default)")
    demo.add_argument("--requests", type=_positive, default=48, help="requests to serve (48)")
    demo.add_argument("--images", type=_positive, default=16, help="distinct images (16)")
    demo.add_argument("--cpu-mib", type=_positive, default=3, help="tier size in MiB (3)")
    demo.add_argument("--seed", type=int, default=0, help="workload seed (0)")
    demo.add_argument("--shm-dir", default="/dev/shm", help="where the region file lives")
    demo.add_argument("--json-logs", action="store_true", help="render logs as JSON")
    demo.add_argument("-v", "--verbose", action="store_true", help="log every tier event")
    from ec_connector.cli.regions import add_parser

    add_parser(sub)
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not > 0")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            from ec_connector.cli.demo import run_demo

            return run_demo(args)
        if args.command == "regions":
            from ec_connector.cli.regions import run_regions

            return run_regions(args)
    except (ECConnectorError, ValueError) as err:
        print(f"ec-connector {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
