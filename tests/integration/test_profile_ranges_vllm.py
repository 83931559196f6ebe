"""The hooks that VLLM_EC_PROFILE_RANGES wraps are the installed vLLM's own: each name is a method
of its `ECConnectorBase` that `ECTierConnector` defines, so a renamed hook cannot silently lose its
range (runs under the vLLM venv's python)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

SCRIPT = """
import json
from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorBase
from ec_connector.adapters.profile_ranges import SCHEDULER_HOOKS, WORKER_HOOKS
from ec_connector.entrypoints.vllm.connector import ECTierConnector

hooks = SCHEDULER_HOOKS + WORKER_HOOKS
print(json.dumps({
    "not_vllms": [h for h in hooks if not callable(getattr(ECConnectorBase, h, None))],
    "not_ours": [h for h in hooks if h not in vars(ECTierConnector)],
}))
"""


def test_the_wrapped_hooks_are_vllms_and_ours(vllm_python: Path) -> None:
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1"}
    out = subprocess.run(
        [str(vllm_python), "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"not_vllms": [], "not_ours": []}
