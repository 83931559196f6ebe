"""The loader of vLLM's in-tree CPU EC connector classes: its code is
`ec_connector.benchmarks.vllm_baseline`.

This module keeps the research benches' `from bench.vllm_baseline import ...` working in a checkout.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ec_connector.benchmarks.vllm_baseline import *  # noqa: E402,F403
