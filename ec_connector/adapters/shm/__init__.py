"""The /dev/shm region adapter: the Region port over one shared, self-cleaning mmap file.

See region.py for the lifecycle, header.py for the file layout, ring.py for the completion
table and reaper.py for orphan handling (`ec-connector regions list|gc`).
"""

from .header import DEFAULT_RING_SLOTS, FORMAT_VERSION, Geometry, Header
from .naming import REGION_GLOB, BadRegionName, check_instance, region_file_name
from .reaper import DEFAULT_SHM_DIR, RegionInfo, list_regions, reap_orphans, remove
from .region import ShmRegion

__all__ = [
    "DEFAULT_RING_SLOTS",
    "DEFAULT_SHM_DIR",
    "FORMAT_VERSION",
    "REGION_GLOB",
    "BadRegionName",
    "Geometry",
    "Header",
    "RegionInfo",
    "ShmRegion",
    "check_instance",
    "list_regions",
    "reap_orphans",
    "region_file_name",
    "remove",
]
