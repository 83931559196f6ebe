"""VLLM_EC_LOG_JSON / VLLM_EC_LOG_LEVEL: how an operator turns on JSON lines in a vLLM engine."""

from __future__ import annotations

import pytest

from ec_connector.logging import options_from_env


def test_defaults_are_logfmt_at_info():
    assert options_from_env({}) == {"json": False, "level": "INFO"}


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", " Yes "])
def test_json_is_enabled_by_the_same_words_as_ec_enable_nixl(value):
    assert options_from_env({"VLLM_EC_LOG_JSON": value})["json"] is True


@pytest.mark.parametrize("value", ["0", "false", "", "on", "json"])
def test_any_other_json_value_keeps_logfmt(value):
    assert options_from_env({"VLLM_EC_LOG_JSON": value})["json"] is False


@pytest.mark.parametrize("value", ["debug", "WARNING", " error "])
def test_level_names_in_any_case(value):
    assert options_from_env({"VLLM_EC_LOG_LEVEL": value})["level"] == value.strip().upper()


@pytest.mark.parametrize("value", ["verbose", "10", ""])
def test_a_bad_level_names_the_variable_the_value_and_the_choices(value):
    with pytest.raises(ValueError) as err:
        options_from_env({"VLLM_EC_LOG_LEVEL": value})
    assert str(err.value) == (
        f"VLLM_EC_LOG_LEVEL = {value!r} is invalid: expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL"
    )
