"""Each data-parallel rank of an instance gets its own identity from the facade's settings.

With data parallelism over a dense model (most VLMs) vLLM runs the ranks as independent engines and
resets `data_parallel_rank` to 0 in each (`ParallelConfig.reconfigure_for_independent_dp_rank`),
keeping the distinct rank in `data_parallel_index`. Here vLLM's real `ParallelConfig` goes through
the two steps its engine core takes for such a rank, and `base_settings` must still give each rank
its own region/agent rank and side-channel port. Runs in the vLLM venv (vLLM is not in the test venv).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = """
import json, sys
from types import SimpleNamespace
from vllm.config import ParallelConfig
from ec_connector.container import parse_settings
from ec_connector.entrypoints.vllm.settings import base_settings

rank = int(sys.argv[1])
parallel = ParallelConfig(data_parallel_size=2, data_parallel_rank=rank)
parallel.data_parallel_index = rank  # what EngineCoreProc does for a dense model's DP rank,
parallel.reconfigure_for_independent_dp_rank()  # then this: data_parallel_rank becomes 0
extra = {"ec_cpu_bytes": 1 << 20, "ec_enable_nixl": True}
ec = SimpleNamespace(ec_role="ec_producer", engine_id="vlm-a", ec_connector_extra_config=extra)
hf = SimpleNamespace(vision_config=None)
model = SimpleNamespace(hf_config=hf, get_hidden_size=lambda: 64, dtype="torch.bfloat16", model="m")
config = SimpleNamespace(ec_transfer_config=ec, model_config=model, parallel_config=parallel)
settings = base_settings(config, parse_settings(extra, role=ec.ec_role))
print(json.dumps({"reset_rank": parallel.data_parallel_rank, "dp_rank": settings["dp_rank"],
                  "side_port": settings["side_port"]}))
"""


@pytest.mark.parametrize("rank", [0, 1])
def test_each_data_parallel_rank_of_a_dense_model_keeps_its_own_rank_and_port(
    vllm_python: Path, rank: int
) -> None:
    env = {**os.environ, "VLLM_EC_SIDE_CHANNEL_PORT": "6000", "VLLM_NO_USAGE_STATS": "1"}
    out = subprocess.run(
        [str(vllm_python), "-c", SCRIPT, str(rank)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-4000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"reset_rank": 0, "dp_rank": rank, "side_port": 6000 + rank}
