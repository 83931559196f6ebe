"""Region file names: `vllm_ec_{instance}_dp{dp_rank}.mmap`, with the instance checked as a safe name."""

from __future__ import annotations

import re

from ec_connector.domain.errors import RegionError

PREFIX = "vllm_ec_"
SUFFIX = ".mmap"
REGION_GLOB = f"{PREFIX}*{SUFFIX}"
"""Every region file this package creates matches this (and only region files do)."""
TEMP_GLOB = f".{PREFIX}*.tmp"
"""Hidden staging files of a region being created (renamed into place by link, then removed)."""

MAX_INSTANCE_LEN = 100
_INSTANCE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
_ACCEPTED = (
    f"1..{MAX_INSTANCE_LEN} characters of [A-Za-z0-9._-], not starting with '.' "
    "(a vLLM engine_id or instance id)"
)


class BadRegionName(RegionError, ValueError):
    """The instance name or data-parallel rank cannot name a region file: pass a safe value."""


def check_instance(instance: object) -> str:
    """`instance` if it is a safe file-name component; `BadRegionName` naming it otherwise."""
    if (
        not isinstance(instance, str)
        or not 1 <= len(instance) <= MAX_INSTANCE_LEN
        or _INSTANCE.fullmatch(instance) is None
    ):
        raise BadRegionName(f"region instance {instance!r} is not a safe file name; expected {_ACCEPTED}")
    return instance


def check_dp_rank(dp_rank: object) -> int:
    if isinstance(dp_rank, bool) or not isinstance(dp_rank, int) or dp_rank < 0:
        raise BadRegionName(f"region dp_rank {dp_rank!r} is not valid; expected an integer >= 0")
    return dp_rank


def region_file_name(instance: str, dp_rank: int) -> str:
    """The file name (no directory) of the region of `instance` at data-parallel rank `dp_rank`."""
    return f"{PREFIX}{check_instance(instance)}_dp{check_dp_rank(dp_rank)}{SUFFIX}"


def temp_file_name(final_name: str, pid: int, token: str) -> str:
    """A hidden staging name for `final_name`: never matches REGION_GLOB."""
    return f".{final_name[: -len(SUFFIX)]}.{pid}.{token}.tmp"


def is_region_name(name: str) -> bool:
    return name.startswith(PREFIX) and name.endswith(SUFFIX) and "/" not in name


def is_temp_name(name: str) -> bool:
    return name.startswith("." + PREFIX) and name.endswith(".tmp") and "/" not in name
