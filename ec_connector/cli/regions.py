"""`ec-connector regions list|gc`: the /dev/shm region files of this host, and their clean-up."""

from __future__ import annotations

import argparse
import os

from ec_connector.adapters.shm import list_regions, reap_orphans, remove


def add_parser(sub: argparse._SubParsersAction) -> None:
    regions = sub.add_parser(
        "regions",
        help="list or remove the /dev/shm region files (vllm_ec_*.mmap)",
        description="Region files of this host: size, creator pid, alive (held by a live process) "
        "or orphaned (left by a process that died).",
    )
    regions.add_argument("--dir", default="/dev/shm", help="directory of the region files")
    actions = regions.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="show every region file")
    gc = actions.add_parser(
        "gc",
        help="remove orphaned region files (or the named ones)",
        description="Without PATHs: remove every orphaned region file of this user. With PATHs: "
        "remove those files; a live one (or another user's) is refused unless --force.",
    )
    gc.add_argument("paths", nargs="*", metavar="PATH", help="region files to remove")
    gc.add_argument("--force", action="store_true", help="also remove live or foreign files")


def run_regions(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.dir):
        raise ValueError(f"{args.dir} is not a directory")
    if args.action == "list":
        return _list(args.dir)
    return _gc(args)


def _list(shm_dir: str) -> int:
    infos = list_regions(shm_dir)
    if not infos:
        print(f"no region files in {shm_dir}")
        return 0
    print(f"{'STATE':9} {'SIZE':>12} {'CREATOR':>8} {'UID':>6}  PATH")
    for info in infos:
        creator = "-" if info.creator_pid is None else str(info.creator_pid)
        print(f"{info.state:9} {info.size_bytes:>12} {creator:>8} {info.uid:>6}  {info.path}")
    return 0


def _gc(args: argparse.Namespace) -> int:
    if not args.paths:
        removed = reap_orphans(args.dir)
        for path in removed:
            print(f"removed {path}")
        print(f"{len(removed)} orphaned region file(s) removed")
        return 0
    for path in args.paths:
        print(f"{'removed' if remove(path, force=args.force) else 'already gone'} {path}")
    return 0
