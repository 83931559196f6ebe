"""The cache benches' two sides (our table, vLLM's EmbeddingCache): its code is
`ec_connector.benchmarks.cache_sides`.

This module keeps the research benches' `from bench.cache_sides import ...` working in a checkout.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ec_connector.benchmarks.cache_sides import *  # noqa: E402,F403
