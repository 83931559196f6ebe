"""The end-to-end serving benchmark: its code is `ec_connector.benchmarks.serving` (run it as `ec-connector
bench serving`, or as this script).

This script keeps `python bench/serving.py ...` working in a checkout where the package is only on
PYTHONPATH.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ec_connector.benchmarks.serving import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
