"""The dependency rule: the core stays free of heavy libraries; local mode never loads P2P ones."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ["torch", "zmq", "nixl", "msgspec", "vllm"]


def _modules_after(code: str) -> set[str]:
    probe = code + "\nimport sys, json\nprint(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_core_imports_no_heavy_library():
    loaded = _modules_after(
        "import ec_connector, ec_connector.domain, ec_connector.ports, ec_connector.application\n"
        "import ec_connector.domain.cache, ec_connector.domain.config, ec_connector.domain.protocol\n"
        "import ec_connector.domain.publish, ec_connector.domain.layout\n"
        "import ec_connector.adapters.memory"
    )
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))
    assert "dependency_injector" not in loaded


def test_local_mode_imports_no_p2p_library(tmp_path):
    loaded = _modules_after(
        "from ec_connector.container import build_container\n"
        f"c = build_container(role='ec_both', extra={{'ec_cpu_bytes': 1 << 20}}, hidden_dim=64,\n"
        f"    instance='archtest', shm_dir={str(tmp_path)!r}, tier='shm', device='cpu')\n"
        "c.tier_scheduler(); c.tier_worker()\n"
        "c.shutdown_resources()"
    )
    assert "torch" in loaded, "the local tier's copier is expected to run on torch"
    assert loaded.isdisjoint({"nixl", "zmq", "msgspec"}), sorted(loaded & {"nixl", "zmq", "msgspec"})


def test_import_linter_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.fail("import-linter is part of the dev extra; `make test` installs it")
    result = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# -- one owner for the scheduler side's state ------------------------------------------------

PACKAGE = ROOT / "ec_connector"
OWNER = PACKAGE / "application" / "scheduler.py"
GUARDED = {"table", "_table", "lock", "_lock"}


def _touches_of_the_table(source: str) -> list[str]:
    """Where `source` reaches the entry table or its lock: an import of the table's module, or an
    attribute `table`/`lock` (public or private) of anything named like the tier or its scheduler."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "ec_connector.domain.cache":
            found.append(f"line {node.lineno}: from ec_connector.domain.cache import ...")
        elif isinstance(node, ast.Import) and any(a.name == "ec_connector.domain.cache" for a in node.names):
            found.append(f"line {node.lineno}: import ec_connector.domain.cache")
        elif isinstance(node, ast.Attribute) and node.attr in GUARDED:
            owner = ast.unparse(node.value).lower()
            if "tier" in owner or "scheduler" in owner:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_table_detector_finds_each_way_in():
    bad = (
        "from ec_connector.domain.cache import EntryTable\n"
        "with self._tier.lock:\n    self._tier.table.drop(key)\n"
        "connector._scheduler._table.get(key)\n"
    )
    assert len(_touches_of_the_table(bad)) == 4
    assert _touches_of_the_table("plan.table\nself.table = x\nwith self._lock: pass\n") == []


def test_only_the_tier_scheduler_touches_the_entry_table_or_its_lock():
    """The scheduler side's locking rule lives in one module: services and entry points call the
    scheduler's intent methods instead of taking its lock and editing its table. The shipped
    benchmarks (ec_connector/benchmarks) replay the domain's table itself, as its unit tests do."""
    offenders = {
        str(path.relative_to(ROOT)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != OWNER and path.parent.name not in ("domain", "benchmarks")
        for hits in [_touches_of_the_table(path.read_text())]
        if hits
    }
    assert offenders == {}


def test_the_tier_scheduler_keeps_its_table_and_lock_private():
    tree = ast.parse(OWNER.read_text())
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TierScheduler"]
    public = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    public |= {
        t.attr
        for n in ast.walk(cls)
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self"
    }
    assert public.isdisjoint({"table", "lock"}), sorted(public & {"table", "lock"})
