"""The ELF NEEDED closure of some shared objects inside an unpacked wheel (used by build_kit.sh).

    python3 elf_closure.py ROOT START.so [START.so ...]

Follows each object's NEEDED entries through its RPATH/RUNPATH ($ORIGIN-relative ones resolved);
prints "size relative/path" for every object found under ROOT, a total, and the NEEDED names left to
the system (libc, libssl, ...). Reads the dynamic sections with `readelf -d`.
"""

from __future__ import annotations

import os
import subprocess
import sys


def dynamic(path: str) -> tuple[list[str], list[str]]:
    """(NEEDED names, RPATH/RUNPATH directories) of one shared object."""
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    needed: list[str] = []
    paths: list[str] = []
    for line in out.splitlines():
        if "(NEEDED)" in line:
            needed.append(line.split("[")[1].rstrip("]"))
        if "(RPATH)" in line or "(RUNPATH)" in line:
            paths += line.split("[")[1].rstrip("]").split(":")
    return needed, paths


def closure(starts: list[str]) -> tuple[list[str], set[str]]:
    """(objects found, in sorted order; NEEDED names not found under the RPATHs)."""
    seen: set[str] = set()
    system: set[str] = set()
    todo = list(starts)
    while todo:
        path = os.path.normpath(todo.pop())
        if path in seen:
            continue
        seen.add(path)
        needed, rpaths = dynamic(path)
        for name in needed:
            found = None
            for directory in rpaths:
                candidate = os.path.join(directory.replace("$ORIGIN", os.path.dirname(path)), name)
                if os.path.exists(candidate):
                    found = os.path.normpath(candidate)
                    break
            if found:
                todo.append(found)
            else:
                system.add(name)
    return sorted(seen), system


def main() -> None:
    root, starts = sys.argv[1], sys.argv[2:]
    objects, system = closure([os.path.join(root, s) for s in starts])
    total = 0
    for path in objects:
        size = os.path.getsize(path)
        total += size
        print(f"{size:>10} {os.path.relpath(path, root)}")
    print("total", total)
    print("system:", " ".join(sorted(system)))


if __name__ == "__main__":
    main()
