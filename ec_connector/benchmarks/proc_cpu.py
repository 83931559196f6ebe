"""CPU time of a process tree, split into each process's main thread and its other threads (Linux
`/proc`), so that a pass's wall time can be set against the CPU its engine spent and where.

A step thread that waits for the GIL spends wall time without CPU time, while the threads that hold
it spend CPU time; a step thread slowed by its own work spends both. A pass record carries the
difference of two `snapshot`s (`delta`): per process, the main thread's CPU seconds and context
switches (voluntary: it blocked, e.g. on the GIL or a lock; involuntary: the kernel took its core),
and the other threads' CPU seconds (those that ended included). Standard library only; empty
where `/proc` is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(path: Path) -> list[str] | None:
    """The fields of a `stat` file after the command name (which may hold spaces), or None."""
    try:
        text = path.read_text()
    except OSError:
        return None
    close = text.rfind(")")
    return text[close + 2 :].split() if close > 0 else None


def _cpu_s(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (stat fields 14, 15)


def descendants(pid: int, proc: Path = PROC) -> list[int]:
    """`pid` and every process below it, parents first."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir() if proc.is_dir() else ():
        if entry.name.isdigit():
            fields = _stat_fields(entry / "stat")
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(sorted(children.get(p, ())))
    return out


def _switches(status: Path) -> tuple[int, int]:
    vol = invol = 0
    try:
        for line in status.read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                vol = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                invol = int(line.split()[1])
    except OSError:
        pass
    return vol, invol


def process(pid: int, proc: Path = PROC) -> dict[str, float | int | str] | None:
    """One process's figures now, or None once it is gone."""
    base = proc / str(pid)
    try:
        comm = (base / "comm").read_text().strip()
    except OSError:
        return None
    # the process's own stat counts threads that have ended too; the main thread's is its task's
    total, main = _stat_fields(base / "stat"), _stat_fields(base / "task" / str(pid) / "stat")
    if total is None or main is None:
        return None
    main_s = _cpu_s(main)
    vol, invol = _switches(base / "task" / str(pid) / "status")
    return {
        "comm": comm,
        "threads": int(total[17]),  # num_threads (stat field 20)
        "main_cpu_s": main_s,
        "others_cpu_s": max(0.0, _cpu_s(total) - main_s),
        "main_voluntary": vol,
        "main_involuntary": invol,
    }


def snapshot(root: int | None = None, proc: Path = PROC) -> dict[int, dict]:
    """The figures of `root` (this process by default) and every process below it."""
    found = {}
    for pid in descendants(os.getpid() if root is None else root, proc):
        figures = process(pid, proc)
        if figures is not None:
            found[pid] = figures
    return found


_COUNTED = ("main_cpu_s", "others_cpu_s", "main_voluntary", "main_involuntary")


def delta(before: dict[int, dict], after: dict[int, dict]) -> list[dict]:
    """What each process alive at both snapshots spent between them, by pid (a process that
    started in between counts from zero)."""
    out = []
    for pid, now in sorted(after.items()):
        then = before.get(pid, {})
        spent = {k: now[k] - then.get(k, 0) for k in _COUNTED}
        # clock ticks are counted per thread and per process apart: the difference can dip a tick
        spent["main_cpu_s"] = round(spent["main_cpu_s"], 3)
        spent["others_cpu_s"] = round(max(0.0, spent["others_cpu_s"]), 3)
        out.append({"pid": pid, "comm": now["comm"], "threads": now["threads"], **spent})
    return out


def busiest(spent: list[dict]) -> dict | None:
    """The process whose main thread spent the most CPU (the engine's step thread, in the bench)."""
    return max(spent, key=lambda p: p["main_cpu_s"], default=None)
