"""`ec_connector_extra_config` (and the side-channel environment) parsed into a frozen value.

vLLM passes the extra config through untouched, so every type is checked here. A rejected value
raises ConfigError (a ValueError) naming the key, the value and the accepted form; nothing is
clamped or coerced silently.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ec_connector.domain.errors import ConfigError
from ec_connector.domain.eviction import DEFAULT_POLICY, POLICIES

EXTRA = "ec_connector_extra_config"
TRUE_STRINGS = frozenset({"true", "1", "yes"})
NIXL_BACKENDS = ("UCX", "LIBFABRIC", "GDS", "POSIX", "OBJ", "MOONCAKE")
UCX_ERROR_MODES = ("none", "peer")
MAX_READ_LANES = 32
DEFAULT_SIDE_CHANNEL_HOST = "localhost"
DEFAULT_SIDE_CHANNEL_PORT = 5601


class Role(str, Enum):
    PRODUCER = "ec_producer"
    CONSUMER = "ec_consumer"
    BOTH = "ec_both"

    @property
    def saves(self) -> bool:
        """Offloads GPU → CPU."""
        return self is not Role.CONSUMER

    @property
    def loads(self) -> bool:
        """Reloads CPU → GPU."""
        return self is not Role.PRODUCER


MIN_RUN_BYTES = 256 * 1024
"""Default of `ec_min_run_bytes`: the copier's copy-engine threshold (runs shorter than this go
through its gather kernel)."""

MAX_ENTRY_RUNS = 4
"""Default of `ec_max_entry_runs`. Each run of an entry is one copy handed to the driver at launch and
one NIXL descriptor, and a full tier with out-of-order frees drifts to many runs per entry; a cap of 4
keeps entries of 1 MiB and more at about 2 runs for 1-2% of occupancy (docs/benchmarks.md, "Region
aging")."""


@dataclass(frozen=True, slots=True)
class ConnectorConfig:
    role: Role
    cpu_bytes: int
    enable_nixl: bool = False
    consumer_ack_timeout_s: float = 2.0
    read_timeout_s: float = 20.0
    quarantine_s: float = 60.0
    producer_pin_lease_s: float = 30.0
    announce_lease_s: float = 60.0
    save_lease_s: float = 30.0
    not_ready_backoff_s: float = 0.05
    not_ready_backoff_max_s: float = 1.0
    not_ready_give_up_s: float = 10.0
    nixl_backend: str = "UCX"
    ucx_error_mode: str = "peer"
    nixl_consumer_progress_thread: bool = True
    nixl_read_lanes: int = 4
    side_channel_secret: str | None = None
    event_feed_address: str | None = None
    min_run_bytes: int = MIN_RUN_BYTES
    """Run floor of the tier's allocation: an entry that must be split is placed in pieces of at
    least this many bytes, evicting a little more (oldest first) where that is what it takes. 0 turns
    it off. The default is the copier's copy-engine threshold: shorter runs go through the gather
    kernel, which carries ~0.8-0.9x of the copy engines' bandwidth over PCIe (docs/benchmarks.md)."""
    max_entry_runs: int = MAX_ENTRY_RUNS
    """Run cap of the tier's allocation: a split entry's pieces are at least this share of it (and
    at least `min_run_bytes`), so it is placed in at most this many runs, evicting a little more
    (oldest first) where that is what it takes, as the floor does. 0 turns it off."""
    eviction: str = DEFAULT_POLICY
    """The tier's eviction policy (`ec_eviction`): "s3fifo" (default) or "fifo" (vLLM's
    EmbeddingCache order, for drop-in parity); docs/eviction.md compares them."""


_SECONDS_KEYS = (
    "consumer_ack_timeout_s",
    "read_timeout_s",
    "quarantine_s",
    "producer_pin_lease_s",
    "announce_lease_s",
    "save_lease_s",
    "not_ready_backoff_s",
    "not_ready_backoff_max_s",
    "not_ready_give_up_s",
)
KNOWN_KEYS = frozenset(
    {
        "ec_cpu_bytes",
        "ec_enable_nixl",
        "ec_min_run_bytes",
        "ec_max_entry_runs",
        "ec_eviction",
        "nixl_backend",
        "nixl_consumer_progress_thread",
        "nixl_read_lanes",
        "ucx_error_mode",
        "side_channel_secret",
        "event_feed_address",
        *_SECONDS_KEYS,
    }
)


def _reject(key: str, value: object, form: str) -> ConfigError:
    return ConfigError(f"{EXTRA}[{key!r}] = {_shown(value)} is invalid: expected {form}")


def _shown(value: object, limit: int = 80) -> str:
    """`repr(value)` cut to `limit` characters (a huge int has no repr past 4300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"<an integer of {value.bit_length()} bits>"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_role(value: object) -> Role:
    try:
        return Role(value)
    except ValueError:
        accepted = ", ".join(repr(r.value) for r in Role)
        raise ConfigError(
            f"ec_role = {value!r} is invalid: expected one of {accepted} "
            "(ec_role is required whenever ec_connector is set)"
        ) from None


def parse_bool_flag(key: str, value: object) -> bool:
    """A bool, or a string that enables only when it is "true", "1" or "yes" (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.strip().lower() in TRUE_STRINGS
    raise _reject(key, value, 'a bool or a string ("true", "1", "yes" enable; anything else disables)')


def parse_cpu_bytes(extra: Mapping[str, Any]) -> int:
    key = "ec_cpu_bytes"
    if key not in extra:
        raise ConfigError(
            f"{EXTRA} is missing required key {key!r}: expected a positive integer number of "
            'bytes, e.g. {"ec_cpu_bytes": 1073741824}'
        )
    value = extra[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _reject(key, value, "a positive integer number of bytes, e.g. 1073741824")
    if value >= 1 << 63:  # no file, mapping or offset can be this large
        raise _reject(key, value, "a number of bytes below 2**63 (the region is one /dev/shm file)")
    return value


def parse_min_run_bytes(value: object) -> int:
    key = "ec_min_run_bytes"
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 63:
        raise _reject(key, value, "an integer number of bytes >= 0 (0 turns the run floor off), e.g. 262144")
    return value


def parse_max_entry_runs(value: object) -> int:
    key = "ec_max_entry_runs"
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1 << 20:
        raise _reject(
            key, value, "an integer number of runs from 0 to 1048576 (0 turns the run cap off), e.g. 4"
        )
    return value


def parse_seconds(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _reject(key, value, "a number of seconds > 0, e.g. 2.0")
    try:
        seconds = float(value)  # an int too large for a float (JSON allows any) is refused here
    except OverflowError:
        raise _reject(key, value, "a finite number of seconds > 0, e.g. 2.0") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise _reject(key, value, "a finite number of seconds > 0, e.g. 2.0")
    return seconds


def parse_read_lanes(value: object) -> int:
    key = "nixl_read_lanes"
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_READ_LANES:
        raise _reject(key, value, f"an integer number of NIXL agents from 1 to {MAX_READ_LANES}, e.g. 4")
    return value


def _parse_choice(key: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise _reject(key, value, "one of " + ", ".join(repr(c) for c in choices))
    return value


def _parse_optional_text(key: str, value: object, form: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _reject(key, value, form)
    return value


def parse_config(extra: object, *, role: object) -> ConnectorConfig:
    """Validate `ec_connector_extra_config` for `role` into a ConnectorConfig."""
    parsed_role = parse_role(role)
    if extra is None:
        extra = {}
    if not isinstance(extra, Mapping):
        raise ConfigError(f"{EXTRA} = {extra!r} is invalid: expected a JSON object (dict)")
    unknown = sorted(set(map(str, extra)) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(
            f"{EXTRA} has unknown key(s) {', '.join(map(repr, unknown))}: "
            f"accepted keys are {', '.join(sorted(KNOWN_KEYS))}"
        )
    fields: dict[str, Any] = {
        "role": parsed_role,
        "cpu_bytes": parse_cpu_bytes(extra),
    }
    if "ec_enable_nixl" in extra:
        fields["enable_nixl"] = parse_bool_flag("ec_enable_nixl", extra["ec_enable_nixl"])
    if "ec_min_run_bytes" in extra:
        fields["min_run_bytes"] = parse_min_run_bytes(extra["ec_min_run_bytes"])
    if "ec_max_entry_runs" in extra:
        fields["max_entry_runs"] = parse_max_entry_runs(extra["ec_max_entry_runs"])
    if "ec_eviction" in extra:
        fields["eviction"] = _parse_choice("ec_eviction", extra["ec_eviction"], POLICIES)
    for key in _SECONDS_KEYS:
        if key in extra:
            fields[key] = parse_seconds(key, extra[key])
    if "nixl_backend" in extra:
        fields["nixl_backend"] = _parse_choice("nixl_backend", extra["nixl_backend"], NIXL_BACKENDS)
    if "nixl_consumer_progress_thread" in extra:
        fields["nixl_consumer_progress_thread"] = parse_bool_flag(
            "nixl_consumer_progress_thread", extra["nixl_consumer_progress_thread"]
        )
    if "nixl_read_lanes" in extra:
        fields["nixl_read_lanes"] = parse_read_lanes(extra["nixl_read_lanes"])
    if "ucx_error_mode" in extra:
        fields["ucx_error_mode"] = _parse_choice("ucx_error_mode", extra["ucx_error_mode"], UCX_ERROR_MODES)
    if "side_channel_secret" in extra:
        fields["side_channel_secret"] = _parse_optional_text(
            "side_channel_secret", extra["side_channel_secret"], "a non-empty string or null"
        )
    if "event_feed_address" in extra:
        fields["event_feed_address"] = _parse_optional_text(
            "event_feed_address",
            extra["event_feed_address"],
            'a ZMQ endpoint string such as "tcp://127.0.0.1:5610", or null',
        )
    config = ConnectorConfig(**fields)
    if config.not_ready_backoff_max_s < config.not_ready_backoff_s:
        raise _reject(
            "not_ready_backoff_max_s",
            config.not_ready_backoff_max_s,
            f"a number >= not_ready_backoff_s ({config.not_ready_backoff_s})",
        )
    return config


@dataclass(frozen=True, slots=True)
class SideChannel:
    """Where a producer's control server listens; port 0: any free port (it advertises the one it got)."""

    host: str = DEFAULT_SIDE_CHANNEL_HOST
    port: int = DEFAULT_SIDE_CHANNEL_PORT

    def for_rank(self, dp_rank: int) -> SideChannel:
        """The channel of data-parallel rank `dp_rank`: each rank's scheduler runs its own server, at
        port + rank (as vLLM's NIXL KV connector offsets its side channel), so that the ranks of one
        host do not collide; port 0 stays 0."""
        port = _rank_port(self.port, dp_rank, f"VLLM_EC_SIDE_CHANNEL_PORT = {self.port}")
        return self if port == self.port else SideChannel(self.host, port)


def endpoint_for_rank(address: str, dp_rank: int) -> str:
    """The event feed endpoint of data-parallel rank `dp_rank`: each rank's scheduler publishes its
    own feed, so rank r > 0 binds a tcp port + r (port 0 or "*" stays: any free port) or, for other
    transports (ipc, inproc), the address with "_dp{r}" appended (vLLM's KV event publisher offsets
    its endpoint the same way)."""
    if dp_rank == 0:
        return address
    if not address.startswith("tcp://"):
        return f"{address}_dp{dp_rank}"
    base, _, port = address.rpartition(":")
    if not port.isdigit():  # "*": any free port
        return address
    setting = f"ec_connector_extra_config['event_feed_address'] = {address!r}"
    return f"{base}:{_rank_port(int(port), dp_rank, setting)}"


def _rank_port(port: int, dp_rank: int, setting: str) -> int:
    """Rank `dp_rank`'s port: `port` + rank, or 0 (any free port) for 0; ConfigError past 65535."""
    if port == 0:
        return 0
    if port + dp_rank > 65535:
        raise ConfigError(
            f"{setting} puts data-parallel rank {dp_rank} at port {port + dp_rank}, past 65535: each "
            "rank uses port + rank; lower the port, or set 0 for any free port"
        )
    return port + dp_rank


def side_channel_from_env(environ: Mapping[str, str]) -> SideChannel:
    """VLLM_EC_SIDE_CHANNEL_HOST / _PORT, read by producers (and ec_both) with NIXL on."""
    host = environ.get("VLLM_EC_SIDE_CHANNEL_HOST", DEFAULT_SIDE_CHANNEL_HOST).strip()
    if not host:
        raise ConfigError("VLLM_EC_SIDE_CHANNEL_HOST is empty: expected a host name or address")
    raw_port = environ.get("VLLM_EC_SIDE_CHANNEL_PORT", str(DEFAULT_SIDE_CHANNEL_PORT))
    port = int(raw_port) if raw_port.isascii() and raw_port.isdigit() else -1
    if not 0 <= port < 65536:
        raise ConfigError(
            f"VLLM_EC_SIDE_CHANNEL_PORT = {raw_port!r} is invalid: expected an integer port 0-65535 "
            "(0: any free port)"
        )
    return SideChannel(host, port)
