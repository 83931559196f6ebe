"""The dependency rule: the core stays free of heavy libraries; local mode never loads P2P ones."""

from __future__ import annotations

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
