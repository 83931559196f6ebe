"""The aging benchmark (the entry table's runs per entry as it ages full): its code is
`ec_connector.benchmarks.aging`.

This module keeps `python bench/aging.py` and the research benches' `from bench.aging import ...`
working in a checkout.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ec_connector.benchmarks.aging import *  # noqa: E402,F403
from ec_connector.benchmarks.aging import main  # noqa: E402

if __name__ == "__main__":
    main()
