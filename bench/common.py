"""The NIXL/P2P benchmarks' shared helpers: its code is `ec_connector.benchmarks.common`.

This module keeps the research benches' `from bench.common import ...` working in a checkout.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ec_connector.benchmarks.common import *  # noqa: E402,F403
