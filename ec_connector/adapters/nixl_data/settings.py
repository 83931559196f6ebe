"""The NIXL data plane's keys of `ec_connector_extra_config`: backend, UCX error mode, read lanes, the
consumer's progress thread and the progress thread's delay. Parsed with the domain's helpers, so
errors read as the tier's do. Importing this module imports no NIXL."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ec_connector.domain.config import parse_bool_flag, parse_choice, reject

from .errors import load_nixl
from .transport import PROGRESS_DELAY_US, UCX_ERROR_MODES

NIXL_BACKENDS = ("UCX", "LIBFABRIC", "GDS", "POSIX", "OBJ", "MOONCAKE")
MAX_READ_LANES = 32
MAX_PROGRESS_DELAY_US = 100_000
KEYS = frozenset(
    {
        "nixl_backend",
        "nixl_consumer_progress_thread",
        "nixl_progress_delay_us",
        "nixl_read_lanes",
        "ucx_error_mode",
    }
)


@dataclass(frozen=True, slots=True)
class NixlSettings:
    backend: str = "UCX"
    ucx_error_mode: str = "peer"
    """What a READ from a producer that died does: "peer" fails it (UCX's peer error handling),
    "none" leaves it to the READ timeout; README.md here."""
    consumer_progress_thread: bool = True
    """An ec_consumer's agent runs NIXL's progress thread (a producer's always does)."""
    read_lanes: int = 4
    """NIXL agents a role that reads cuts each READ across (a producer serves with one)."""
    progress_delay_us: int = PROGRESS_DELAY_US
    """The progress thread's wait between passes when no UCX event wakes it; 0 spins a core."""


def parse_read_lanes(value: object) -> int:
    key = "nixl_read_lanes"
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_READ_LANES:
        raise reject(key, value, f"an integer number of NIXL agents from 1 to {MAX_READ_LANES}, e.g. 4")
    return value


def parse_progress_delay_us(value: object) -> int:
    key = "nixl_progress_delay_us"
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PROGRESS_DELAY_US:
        raise reject(
            key,
            value,
            f"an integer number of microseconds from 0 (spin) to {MAX_PROGRESS_DELAY_US}, e.g. 1000",
        )
    return value


def parse_nixl_settings(extra: Mapping[str, Any]) -> NixlSettings:
    """The NIXL keys of `extra` (already known to be a mapping); absent keys take the defaults."""
    fields: dict[str, Any] = {}
    if "nixl_backend" in extra:
        fields["backend"] = parse_choice("nixl_backend", extra["nixl_backend"], NIXL_BACKENDS)
    if "nixl_consumer_progress_thread" in extra:
        fields["consumer_progress_thread"] = parse_bool_flag(
            "nixl_consumer_progress_thread", extra["nixl_consumer_progress_thread"]
        )
    if "nixl_progress_delay_us" in extra:
        fields["progress_delay_us"] = parse_progress_delay_us(extra["nixl_progress_delay_us"])
    if "nixl_read_lanes" in extra:
        fields["read_lanes"] = parse_read_lanes(extra["nixl_read_lanes"])
    if "ucx_error_mode" in extra:
        fields["ucx_error_mode"] = parse_choice("ucx_error_mode", extra["ucx_error_mode"], UCX_ERROR_MODES)
    return NixlSettings(**fields)


def require_nixl() -> None:
    """Fail at start with the documented RuntimeError(NIXL_MISSING) when NIXL is enabled but cannot
    be imported, rather than at the first transfer."""
    load_nixl()
