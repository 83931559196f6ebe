"""The cache benchmark (our entry table against vLLM's EmbeddingCache): its code is
`ec_connector.benchmarks.compare_cache` (run it as `ec-connector bench cache`, or as this script).

This module keeps `python bench/compare_cache.py` and the research benches' `from bench.compare_cache
import ...` working in a checkout.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ec_connector.benchmarks.compare_cache import *  # noqa: E402,F403
from ec_connector.benchmarks.compare_cache import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
