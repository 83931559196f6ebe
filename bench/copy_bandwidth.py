"""The copy bandwidth benchmark: its code is `ec_connector.benchmarks.copy_bandwidth` (run it as `ec-
connector bench copy`, or as this script).

This module keeps `python bench/copy_bandwidth.py` and the research benches' `from bench.copy_bandwidth
import ...` working in a checkout.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ec_connector.benchmarks.copy_bandwidth import *  # noqa: E402,F403
from ec_connector.benchmarks.copy_bandwidth import main  # noqa: E402

if __name__ == "__main__":
    main()
