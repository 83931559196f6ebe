"""Fuzzing the configuration parser: `parse_settings` over arbitrary dicts and JSON documents, and
the side-channel environment. Every input parses into a consistent ConnectorConfig or raises
ConfigError (a ValueError) naming what is wrong; never another exception.
"""

from __future__ import annotations

import json
import math

from conftest import FUZZ, batch, count
from hypothesis import example, given
from hypothesis import strategies as st

from ec_connector.adapters.zmq_settings import side_channel_from_env
from ec_connector.container import KNOWN_KEYS, parse_settings
from ec_connector.domain.config import _SECONDS_KEYS, EXTRA, ConnectorConfig, Role
from ec_connector.domain.errors import ConfigError

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(10**400), 10**400)  # JSON integers need not fit a float
    | st.floats()
    | st.text(max_size=16)
    | st.sampled_from(["true", "YES", "1", "0", "UCX", "peer", "none", "tcp://127.0.0.1:5610", ""])
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
key_names = st.sampled_from(sorted(KNOWN_KEYS)) | st.text(max_size=24)
extras = st.dictionaries(key_names, json_values, max_size=8)
# mostly-valid documents: ec_cpu_bytes present and sane, so later keys are reached
mostly_valid = st.fixed_dictionaries(
    {"ec_cpu_bytes": st.integers(1, 2**40)},
    optional={k: json_values | st.floats(0.001, 1e6) for k in sorted(KNOWN_KEYS - {"ec_cpu_bytes"})},
)
roles = st.sampled_from([r.value for r in Role]) | json_values


def check(extra: object, role: object) -> None:
    try:
        config = parse_settings(extra, role=role).tier
    except ConfigError as err:
        message = str(err)
        assert isinstance(err, ValueError)
        assert EXTRA in message or "ec_role" in message, message
        assert "expected" in message or "accepted" in message, f"no accepted form given: {message}"
        return
    assert isinstance(config, ConnectorConfig)
    assert isinstance(config.role, Role)
    assert isinstance(config.cpu_bytes, int) and config.cpu_bytes > 0
    for name in _SECONDS_KEYS:
        value = getattr(config, name)
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (name, value)
    hold = config.announce_hold_s
    assert isinstance(hold, float) and math.isfinite(hold) and hold >= 0, hold
    assert config.not_ready_backoff_max_s >= config.not_ready_backoff_s
    assert isinstance(config.enable_nixl, bool)


@FUZZ
@given(batch(st.tuples(extras | mostly_valid, roles)))
@example([({"ec_cpu_bytes": 1, "read_timeout_s": 10**400}, "ec_consumer")])
@example([({"ec_cpu_bytes": 1, "quarantine_s": -(10**400)}, "ec_consumer")])
def test_config_dicts_parse_or_raise_config_error(cases: list[tuple[dict, object]]) -> None:
    for extra, role in cases:
        count("config: dicts")
        check(extra, role)


@FUZZ
@given(
    batch(
        st.text(max_size=200)
        | mostly_valid.map(json.dumps)
        | extras.map(lambda d: json.dumps(d, default=str))
    )
)
@example(['{"ec_cpu_bytes": 1024, "consumer_ack_timeout_s": 1' + "0" * 400 + "}"])
def test_config_json_documents_parse_or_raise_config_error(documents: list[str]) -> None:
    for document in documents:
        count("config: JSON documents")
        try:
            extra = json.loads(document)
        except ValueError:
            continue  # not JSON: vLLM refuses it before we see it
        check(extra, "ec_producer")


@FUZZ
@given(
    batch(
        st.dictionaries(
            st.sampled_from(["VLLM_EC_SIDE_CHANNEL_HOST", "VLLM_EC_SIDE_CHANNEL_PORT", "OTHER"]),
            st.text(max_size=12)
            | st.integers(-5, 70000).map(str)
            | st.sampled_from(["", " ", "٣", "²", "0x10"]),
        )
    )
)
def test_side_channel_env_parses_or_raises_config_error(environs: list[dict[str, str]]) -> None:
    for environ in environs:
        count("config: side-channel env")
        try:
            channel = side_channel_from_env(environ)
        except ConfigError as err:
            assert "VLLM_EC_SIDE_CHANNEL_" in str(err)
            continue
        assert channel.host and channel.host == channel.host.strip()
        assert 0 <= channel.port < 65536
