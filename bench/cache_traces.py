"""The cache benches' workload traces: its code is `ec_connector.benchmarks.cache_traces`.

This module keeps the research benches' `from bench.cache_traces import ...` working in a checkout.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ec_connector.benchmarks.cache_traces import *  # noqa: E402,F403
