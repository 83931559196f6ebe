"""`LogfmtLine` renders what structlog's LogfmtRenderer(key_order=["event"], drop_missing=True) does."""

from __future__ import annotations

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from ec_connector.logging import LogfmtLine

REFERENCE = structlog.processors.LogfmtRenderer(key_order=["event"], drop_missing=True)

keys = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=12)
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(st.sampled_from('ab =\\"\n\tx'), max_size=12),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=3),
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(keys, values, max_size=8), st.one_of(st.none(), st.text(max_size=10)))
def test_same_line_as_structlog(fields: dict, event: str | None) -> None:
    event_dict = {"event": event, **fields} if event is not None else dict(fields)
    assert LogfmtLine()(None, "info", dict(event_dict)) == REFERENCE(None, "info", dict(event_dict))


@pytest.mark.parametrize("key", ["has space", "tab\there", "nl\n", "\x00"])
def test_a_key_logfmt_cannot_carry_is_refused_as_structlog_does(key: str) -> None:
    with pytest.raises(ValueError, match="Invalid key"):
        LogfmtLine()(None, "info", {"event": "x", key: 1})
    with pytest.raises(ValueError, match="Invalid key"):
        REFERENCE(None, "info", {"event": "x", key: 1})
