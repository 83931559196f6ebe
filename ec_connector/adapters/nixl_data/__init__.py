"""The NIXL data-plane adapter: the PeerTransport port over a NIXL agent (UCX by default).

Importing this package does not import NIXL; `NixlPeerTransport(...)` does, and raises
RuntimeError(NIXL_MISSING) when it is not installed (`pip install --no-deps -r requirements/p2p.txt`).
Only this package imports nixl. See README.md here for configuration, UCX_TLS and failure modes.
"""

from ec_connector.adapters.nixl_data.errors import NIXL_MISSING, DataPlaneError, PeerUnreachable
from ec_connector.adapters.nixl_data.lanes import LanedPeerTransport, open_lanes
from ec_connector.adapters.nixl_data.runs import pair_runs
from ec_connector.adapters.nixl_data.transport import UCX_ERROR_MODES, NixlPeerTransport

__all__ = [
    "NIXL_MISSING",
    "UCX_ERROR_MODES",
    "DataPlaneError",
    "LanedPeerTransport",
    "NixlPeerTransport",
    "PeerUnreachable",
    "open_lanes",
    "pair_runs",
]
