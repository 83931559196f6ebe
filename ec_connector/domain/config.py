"""The tier's rules in `ec_connector_extra_config`, parsed into a frozen value.

vLLM passes the extra config through untouched, so every type is checked here. A rejected value
raises ConfigError (a ValueError) naming the key, the value and the accepted form; nothing is
clamped or coerced silently. The keys of the adapters (NIXL, the ZMQ side channel and event feed)
are parsed beside those adapters with the helpers below; the composition root's `parse_settings`
reads the whole document once and rejects any key that no part knows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ec_connector.domain.errors import ConfigError
from ec_connector.domain.eviction import DEFAULT_POLICY, POLICIES
from ec_connector.domain.pull_rule import PullRule

EXTRA = "ec_connector_extra_config"
TRUE_STRINGS = frozenset({"true", "1", "yes"})


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

STEP_ACK_WAIT_S = 0.002
"""Default of `step_ack_wait_s`: a producer on the same host or network acks within a millisecond,
and an engine step lasts tens of milliseconds, so waiting this long at most saves a pulled
request a whole step."""
MAX_STEP_WAIT_S = 0.1

STEP_PULL_WAIT_S = 0.005
"""Default of `step_pull_wait_s`: a pull of one encoding from a peer on the same host lands in one to
two milliseconds (ack and READ), and a request whose pull lands while its step is scheduled runs in
that step instead of the next, which saves it a whole step (tens of milliseconds)."""

ANNOUNCE_LEASE_S = 60.0
"""Default of `announce_lease_s` on `ec_producer`: what it publishes is held (not evicted unless
read) long enough for the consumer its orchestrator picks to pull it; `ec_both`'s default is 0
(ConnectorConfig.announce_hold_s)."""

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
    announce_lease_s: float | None = None
    """How long an entry this instance published in `ec_transfer_params` is held, not evicted unless
    read (`announce_lease_s`); 0: not held (it stays in the eviction order; a consumer that asks
    after it left is answered NACK_MISSING and encodes). None: the role's default
    (`announce_hold_s`)."""
    save_lease_s: float = 30.0
    not_ready_backoff_s: float = 0.005
    """First retry delay after NACK_NOT_READY, doubling each retry: a producer answers that when a
    consumer asks within milliseconds of the save's launch, and the save lands a few milliseconds
    later, so a first retry sooner than one engine step spares the request most of its wait."""
    not_ready_backoff_max_s: float = 1.0
    not_ready_give_up_s: float = 10.0
    step_ack_wait_s: float = STEP_ACK_WAIT_S
    """The longest an engine step waits at its end for the acks of the pulls it asked for
    (`step_ack_wait_s`); 0: none (an ack is then handled at the next step, its request scheduled a
    step later)."""
    step_pull_wait_s: float = STEP_PULL_WAIT_S
    """The longest, in all, that scheduling one engine step waits for the pulls it starts to land
    (`step_pull_wait_s`): a request whose items land within it is scheduled in that step; 0: none
    (the request waits for a later step)."""
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
    """The tier's eviction policy (`ec_eviction`): "duel" (default), "s3fifo", "lecar" or "fifo"
    (vLLM's EmbeddingCache order, for drop-in parity); docs/eviction.md compares them."""
    tenant_scopes: bool = True
    """Keep the entries of requests with different `cache_salt`s apart (`tenant_scopes`): a salted
    request's items are stored and looked up under keys of its salt's scope (domain/scope.py);
    unsalted requests use vLLM's identifiers unchanged. False: one key per identifier, as vLLM."""

    @property
    def announce_hold_s(self) -> float:
        """Seconds a published entry is held: `announce_lease_s`, else the role's default,
        ANNOUNCE_LEASE_S on `ec_producer` (its region serves its consumers) and 0 on `ec_both` (its
        region also serves its own requests and its fleet, and holding all it published for a
        minute would leave its eviction policy nothing recent to evict)."""
        if self.announce_lease_s is not None:
            return self.announce_lease_s
        return ANNOUNCE_LEASE_S if self.role is Role.PRODUCER else 0.0


_SECONDS_KEYS = (
    "consumer_ack_timeout_s",
    "read_timeout_s",
    "quarantine_s",
    "producer_pin_lease_s",
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
        "tenant_scopes",
        "step_ack_wait_s",
        "step_pull_wait_s",
        "announce_lease_s",
        *_SECONDS_KEYS,
    }
)
"""The tier's keys; the adapters' keys are listed beside them (`KEYS` of their settings modules)."""


def reject(key: str, value: object, form: str) -> ConfigError:
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
    raise reject(key, value, 'a bool or a string ("true", "1", "yes" enable; anything else disables)')


def parse_cpu_bytes(extra: Mapping[str, Any]) -> int:
    key = "ec_cpu_bytes"
    if key not in extra:
        raise ConfigError(
            f"{EXTRA} is missing required key {key!r}: expected a positive integer number of "
            'bytes, e.g. {"ec_cpu_bytes": 1073741824}'
        )
    value = extra[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise reject(key, value, "a positive integer number of bytes, e.g. 1073741824")
    if value >= 1 << 63:  # no file, mapping or offset can be this large
        raise reject(key, value, "a number of bytes below 2**63 (the region is one /dev/shm file)")
    return value


def parse_min_run_bytes(value: object) -> int:
    key = "ec_min_run_bytes"
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 63:
        raise reject(key, value, "an integer number of bytes >= 0 (0 turns the run floor off), e.g. 262144")
    return value


def parse_max_entry_runs(value: object) -> int:
    key = "ec_max_entry_runs"
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1 << 20:
        raise reject(
            key, value, "an integer number of runs from 0 to 1048576 (0 turns the run cap off), e.g. 4"
        )
    return value


def _finite_number(key: str, value: object, form: str, finite_form: str | None = None) -> float:
    """`value` as a finite float; ConfigError with `form` for anything but an int or float (a bool
    is not a number here), with `finite_form` (default `form`) for an infinite or NaN one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise reject(key, value, form)
    try:
        number = float(value)  # an int too large for a float (JSON allows any) is refused here
    except OverflowError:
        raise reject(key, value, finite_form or form) from None
    if not math.isfinite(number):
        raise reject(key, value, finite_form or form)
    return number


def parse_seconds(key: str, value: object, *, zero: bool = False) -> float:
    """Seconds > 0, or >= 0 with `zero` (where 0 turns the key's hold off)."""
    bound = ">= 0" if zero else "> 0"
    form = f"a finite number of seconds {bound}, e.g. 2.0"
    seconds = _finite_number(key, value, f"a number of seconds {bound}, e.g. 2.0", form)
    if seconds < 0 or (seconds == 0 and not zero):
        raise reject(key, value, form)
    return seconds


def parse_step_wait(key: str, value: object, default: float) -> float:
    """A step's wait (`step_ack_wait_s`, `step_pull_wait_s`): seconds from 0 to a tenth."""
    form = f"a number of seconds from 0 to {MAX_STEP_WAIT_S} (0: no wait), e.g. {default}"
    seconds = _finite_number(key, value, form)
    if not 0 <= seconds <= MAX_STEP_WAIT_S:
        raise reject(key, value, form)
    return seconds


def parse_choice(key: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise reject(key, value, "one of " + ", ".join(repr(c) for c in choices))
    return value


def parse_optional_text(key: str, value: object, form: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise reject(key, value, form)
    return value


def parse_config(extra: object, *, role: object, other_keys: frozenset[str] = frozenset()) -> ConnectorConfig:
    """Validate the tier's keys of `ec_connector_extra_config` for `role` into a ConnectorConfig.

    `other_keys`: the adapters' keys, parsed by their own settings modules; any key in neither set
    is rejected, naming every accepted key."""
    parsed_role = parse_role(role)
    extra = as_mapping(extra)
    known = KNOWN_KEYS | other_keys
    unknown = sorted(set(map(str, extra)) - known)
    if unknown:
        raise ConfigError(
            f"{EXTRA} has unknown key(s) {', '.join(map(repr, unknown))}: "
            f"accepted keys are {', '.join(sorted(known))}"
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
        fields["eviction"] = parse_choice("ec_eviction", extra["ec_eviction"], POLICIES)
    if "tenant_scopes" in extra:
        fields["tenant_scopes"] = parse_bool_flag("tenant_scopes", extra["tenant_scopes"])
    for key in _SECONDS_KEYS:
        if key in extra:
            fields[key] = parse_seconds(key, extra[key])
    if "announce_lease_s" in extra:
        fields["announce_lease_s"] = parse_seconds("announce_lease_s", extra["announce_lease_s"], zero=True)
    for key, default in (("step_ack_wait_s", STEP_ACK_WAIT_S), ("step_pull_wait_s", STEP_PULL_WAIT_S)):
        if key in extra:
            fields[key] = parse_step_wait(key, extra[key], default)
    config = ConnectorConfig(**fields)
    if config.not_ready_backoff_max_s < config.not_ready_backoff_s:
        raise reject(
            "not_ready_backoff_max_s",
            config.not_ready_backoff_max_s,
            f"a number >= not_ready_backoff_s ({config.not_ready_backoff_s})",
        )
    return config


def as_mapping(extra: object) -> Mapping[str, Any]:
    """The extra config as a mapping: None (vLLM's default) is empty; anything else is refused."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise ConfigError(f"{EXTRA} = {extra!r} is invalid: expected a JSON object (dict)")
    return extra


def rank_port(port: int, dp_rank: int, setting: str) -> int:
    """Data-parallel rank `dp_rank`'s port: `port` + rank (the ranks of one host each listen at their
    own), or 0 (any free port) for 0; ConfigError naming `setting` past 65535."""
    if port == 0:
        return 0
    if port + dp_rank > 65535:
        raise ConfigError(
            f"{setting} puts data-parallel rank {dp_rank} at port {port + dp_rank}, past 65535: each "
            "rank uses port + rank; lower the port, or set 0 for any free port"
        )
    return port + dp_rank


# -- fleet sharing (docs/fleet.md) ------------------------------------------------------------

_PEER_FIELDS = ("engine_id", "event_feed", "peer_host", "peer_port")
_PEER_FORM = (
    'a list of peers, each {"event_feed": "tcp://host:port"} (the peer says who it is in its feed\'s '
    'hello frames) or {"engine_id": str, "event_feed": "tcp://host:port", "peer_host": str, '
    '"peer_port": int 1-65535}, with distinct engine_ids and event_feeds'
)


@dataclass(frozen=True, slots=True)
class FleetPeer:
    """A replica this one may pull from: where its feed is bound, and its engine id (what its event
    feed publishes) and side channel, or None for all three: its feed's hello frames tell them."""

    event_feed: str
    engine_id: str | None = None
    peer_host: str | None = None
    peer_port: int | None = None


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """Fleet sharing's keys: the static peer list, the heartbeat bound, the pull rule's figures and
    the directory's bounds. No peers: no fleet (nothing subscribed, nothing pulled)."""

    peers: tuple[FleetPeer, ...] = ()
    heartbeat_timeout_s: float = 3.0
    encode_us_per_row: float = 10.0
    read_gib_s: float = 3.5
    pull_fixed_ms: float = 1.5
    max_entries: int = 262_144
    max_entries_per_peer: int = 65_536
    max_pulls_in_flight: int = 64

    @property
    def enabled(self) -> bool:
        return bool(self.peers)

    def pull_rule(self) -> PullRule:
        """The rule these figures give (microseconds, milliseconds and GiB/s to seconds and bytes)."""
        return PullRule(
            encode_s_per_row=self.encode_us_per_row * 1e-6,
            fixed_s=self.pull_fixed_ms * 1e-3,
            bytes_per_s=self.read_gib_s * (1 << 30),
        )


_FLEET_FIGURES = {
    # key: (field, must be > 0 (else >= 0), example)
    "fleet_encode_us_per_row": ("encode_us_per_row", False, "10.0"),
    "fleet_read_gib_s": ("read_gib_s", True, "3.5"),
    "fleet_pull_fixed_ms": ("pull_fixed_ms", False, "1.5"),
}
_FLEET_COUNTS = {
    "fleet_max_entries": ("max_entries", "262144"),
    "fleet_max_entries_per_peer": ("max_entries_per_peer", "65536"),
    "fleet_max_pulls_in_flight": ("max_pulls_in_flight", "64"),
}
FLEET_KEYS = frozenset({"fleet_peers", "fleet_heartbeat_timeout_s", *_FLEET_FIGURES, *_FLEET_COUNTS})
"""Fleet sharing's keys of `ec_connector_extra_config`."""


def parse_fleet_config(extra: Mapping[str, Any], tier: ConnectorConfig) -> FleetConfig:
    """The fleet keys of `extra` (already known to be a mapping) for a replica configured as `tier`.

    Peers are refused where this replica cannot pull (NIXL off, or `ec_producer`): a fleet that
    would silently do nothing is a configuration error."""
    fields: dict[str, Any] = {}
    if "fleet_peers" in extra:
        fields["peers"] = _parse_peers(extra["fleet_peers"])
    if "fleet_heartbeat_timeout_s" in extra:
        fields["heartbeat_timeout_s"] = parse_seconds(
            "fleet_heartbeat_timeout_s", extra["fleet_heartbeat_timeout_s"]
        )
    for key, (name, positive, example) in _FLEET_FIGURES.items():
        if key in extra:
            fields[name] = _parse_figure(key, extra[key], positive=positive, example=example)
    for key, (name, example) in _FLEET_COUNTS.items():
        if key in extra:
            value = extra[key]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << 31:
                raise reject(key, value, f"an integer from 1 to 2147483647, e.g. {example}")
            fields[name] = value
    fleet = FleetConfig(**fields)
    if fleet.max_entries_per_peer > fleet.max_entries:
        raise reject(
            "fleet_max_entries_per_peer",
            fleet.max_entries_per_peer,
            f"an integer <= fleet_max_entries ({fleet.max_entries})",
        )
    if fleet.peers and not (tier.enable_nixl and tier.role.loads):
        raise reject(
            "fleet_peers",
            extra["fleet_peers"],
            "[] (no fleet) for this replica: fleet pulls need ec_enable_nixl on and ec_role "
            f"'ec_both' or 'ec_consumer' (here ec_enable_nixl={tier.enable_nixl}, "
            f"ec_role={tier.role.value!r})",
        )
    return fleet


def _parse_figure(key: str, value: object, *, positive: bool, example: str) -> float:
    form = f"a finite number {'> 0' if positive else '>= 0'}, e.g. {example}"
    number = _finite_number(key, value, form)
    if number < 0 or (positive and number == 0):
        raise reject(key, value, form)
    return number


def _parse_peers(value: object) -> tuple[FleetPeer, ...]:
    if not isinstance(value, list):
        raise reject("fleet_peers", value, _PEER_FORM)
    peers = tuple(_parse_peer(n, item) for n, item in enumerate(value))
    for name in ("engine_id", "event_feed"):
        listed = [getattr(p, name) for p in peers if getattr(p, name) is not None]
        if len(set(listed)) != len(listed):
            duplicated = sorted({i for i in listed if listed.count(i) > 1})
            raise reject("fleet_peers", value, f"{_PEER_FORM} ({name} {duplicated[0]!r} is listed twice)")
    return peers


def _parse_peer(n: int, item: object) -> FleetPeer:
    where = f"{EXTRA}['fleet_peers'][{n}]"
    if not isinstance(item, Mapping):
        raise ConfigError(f"{where} = {_shown(item)} is invalid: expected {_PEER_FORM}")
    names = set(map(str, item))
    if names != set(_PEER_FIELDS) and names != {"event_feed"}:
        missing, unknown = sorted(set(_PEER_FIELDS) - names), sorted(names - set(_PEER_FIELDS))
        what = "; ".join(
            part
            for part in (
                f"missing {', '.join(map(repr, missing))}" if missing else "",
                f"unknown {', '.join(map(repr, unknown))}" if unknown else "",
            )
            if part
        )
        raise ConfigError(
            f"{where} = {_shown(item)} is invalid ({what}): expected exactly the keys "
            f"{', '.join(_PEER_FIELDS)}, or event_feed alone (the peer's hello frames tell the others)"
        )
    texts = {}
    for name in ("engine_id", "event_feed", "peer_host") if len(names) > 1 else ("event_feed",):
        text = item[name]
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"{where}[{name!r}] = {_shown(text)} is invalid: expected a non-empty string")
        texts[name] = text
    if "://" not in texts["event_feed"]:
        raise ConfigError(
            f"{where}['event_feed'] = {_shown(texts['event_feed'])} is invalid: expected a ZMQ endpoint "
            'such as "tcp://10.0.0.2:5610" (the peer\'s event_feed_address, reachable from here)'
        )
    if len(names) == 1:
        return FleetPeer(texts["event_feed"])
    port = item["peer_port"]
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigError(
            f"{where}['peer_port'] = {_shown(port)} is invalid: expected an integer port 1-65535 "
            "(the peer's VLLM_EC_SIDE_CHANNEL_PORT)"
        )
    return FleetPeer(texts["event_feed"], texts["engine_id"], texts["peer_host"], port)
