"""How a benchmark hands its figures out: the JSON file, the goal lines under its table, and the
headless matplotlib its PNG is drawn with (imported only when a plot is asked for)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: str | Path, figures: dict[str, Any]) -> None:
    """`figures` as indented JSON at `path`, its folder made if missing."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")


def goal_lines(goals: dict[str, dict[str, Any]]) -> list[str]:
    """One line per goal: its target, the measured value and whether it was met."""
    return [
        f"goal {name}: {goal['target']}: {goal['value']} -> {'met' if goal['met'] else 'NOT met'}"
        for name, goal in goals.items()
    ]


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display is needed to write a PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
