"""In-memory adapters of every port: shipped for service tests and the synthetic demo.

Each passes the same contract tests as the real adapter it stands in for.
"""

from ec_connector.adapters.memory.control import MemoryControlClient, MemoryControlServer, MemoryNetwork
from ec_connector.adapters.memory.copier import HostPayload, MemoryCopier
from ec_connector.adapters.memory.peer import MemoryPeerTransport, MemoryPeerWorld
from ec_connector.adapters.memory.region import MemoryRegion
from ec_connector.adapters.memory.runtime import ManualClock, RecordingEventSink

__all__ = [
    "HostPayload",
    "ManualClock",
    "MemoryControlClient",
    "MemoryControlServer",
    "MemoryCopier",
    "MemoryNetwork",
    "MemoryPeerTransport",
    "MemoryPeerWorld",
    "MemoryRegion",
    "RecordingEventSink",
]
