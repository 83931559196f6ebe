"""The P2P benchmark (ZMQ ack + NIXL READ between two processes): its code is `ec_connector.benchmarks.p2p`
(run it as `ec-connector bench p2p`, or as this script).

This script keeps `python bench/p2p.py ...` working in a checkout where the package is only on
PYTHONPATH.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ec_connector.benchmarks.p2p import main  # noqa: E402

if __name__ == "__main__":
    main()
