"""The numbers Python and C share for the batch planner are one list, checked from both sources.

batchplan.c and batchplan.py each name the `io[]` slots, the workspace sections and the status
codes, and queue.h numbers the CUDA calls that build.py's `QUEUE_CALLS` describes. Nothing is
compiled or run here: both sources are parsed, so a slot added on one side only fails at once, on
any machine.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ec_connector.adapters.torch_copy.native import batchplan, build

NATIVE = Path(batchplan.__file__).parent
C_SOURCE = (NATIVE / "batchplan.c").read_text()
PY_SOURCE = Path(batchplan.__file__).read_text()
KERNELS = NATIVE.parent / "kernels.py"


def _c_enums(text: str) -> list[list[tuple[str, int]]]:
    """Each `enum { ... }` of `text`: its (name, value) pairs in order (values counted as C does)."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
    enums = []
    for body in re.findall(r"\benum\s*\{(.*?)\}", text, flags=re.DOTALL):
        pairs, value = [], 0
        for item in (part.strip() for part in body.split(",")):
            if not item:
                continue
            name, _, given = (s.strip() for s in item.partition("="))
            if given:
                try:
                    value = int(given)
                except ValueError:  # an expression of other names (SECTIONS = W_RUNS + ...)
                    continue
            pairs.append((name, value))
            value += 1
        enums.append(pairs)
    return enums


def _py_slots(text: str) -> list[str]:
    """The names of batchplan.py's `(IN_..., OUT_...) = range(n)`, in order, checking n."""
    for node in ast.parse(text).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Tuple)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func) == "range"
        ):
            names = [t.id for t in node.targets[0].elts if isinstance(t, ast.Name)]
            if names and names[0].startswith("IN_"):
                assert ast.literal_eval(node.value.args[0]) == len(names)
                return names
    raise AssertionError("batchplan.py has no `(IN_..., OUT_...) = range(n)` slot list")


def test_the_c_enum_parser_counts_as_c_does():
    text = "enum { A, B /* note, with a comma */, C = 7, D, E = A + 1 };"
    assert _c_enums(text) == [[("A", 0), ("B", 1), ("C", 7), ("D", 8)]]


def test_the_io_slots_are_the_same_names_in_the_same_order_in_c_and_python():
    c_slots = [(n, v) for n, v in _c_enums(C_SOURCE)[0] if n.startswith(("IN_", "OUT_"))]
    py_slots = _py_slots(PY_SOURCE)
    assert [n for n, _ in c_slots] == py_slots
    assert [v for _, v in c_slots] == list(range(len(py_slots)))
    assert [getattr(batchplan, name) for name in py_slots] == list(range(len(py_slots)))
    io_slots = dict(_c_enums(C_SOURCE)[0])["IO_SLOTS"]
    assert len(py_slots) <= io_slots, "io[] is allocated with IO_SLOTS values (ec_plan_io_slots)"


def test_workspace_sections_and_status_codes_match():
    enums = {name: value for pairs in _c_enums(C_SOURCE) for name, value in pairs}
    sections = {"DMA_DST": 0, "DMA_SRC": 1, "DMA_SIZE": 2, "TABLE": 3}
    for name, value in sections.items():
        assert enums[f"W_{name}"] == value == getattr(batchplan, f"_SECTION_{name}")
    assert (enums["OK"], enums["BAD_CAPACITY"]) == (batchplan._OK, batchplan._BAD_CAPACITY)


def test_inline_runs_match_the_kernel():
    [c_inline] = re.findall(r"#define INLINE_RUNS (\d+)", C_SOURCE)
    kernel = {
        t.id: node.value
        for node in ast.parse(KERNELS.read_text()).body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    assert ast.literal_eval(kernel["INLINE_RUNS"]) == int(c_inline)


def test_every_queued_call_queue_h_numbers_is_described_for_errors():
    calls = {
        name: value
        for pairs in _c_enums((NATIVE / "queue.h").read_text())
        for name, value in pairs
        if name.startswith("EC_CALL_")
    }
    assert len(calls) == 7
    assert sorted(calls.values()) == sorted(build.QUEUE_CALLS)
