"""`log_context`: the fields every line logged inside a `with` carries."""

from __future__ import annotations

import threading

import pytest

from ec_connector.logging import _merge_log_context, log_context


def _line(**fields: object) -> dict:
    return dict(_merge_log_context(None, "info", {"event": "e", **fields}))


def test_lines_carry_the_enclosing_fields_and_their_own_win():
    assert _line(a=1) == {"event": "e", "a": 1}, "no context: the line as logged"
    with log_context(mm_hash="k", peer="p"):
        with log_context(peer="q", request_id="r"):
            line = _line(peer="own")
            assert line == {"mm_hash": "k", "peer": "own", "request_id": "r", "event": "e"}
            assert list(line)[:3] == ["mm_hash", "peer", "request_id"], "context first, as structlog's"
        assert _line() == {"mm_hash": "k", "peer": "p", "event": "e"}, "inner fields gone on exit"
    assert _line() == {"event": "e"}


def test_the_context_is_restored_when_the_block_raises():
    with pytest.raises(RuntimeError), log_context(mm_hash="k"):
        raise RuntimeError("boom")
    assert _line() == {"event": "e"}


def test_another_thread_does_not_see_this_threads_context():
    seen: list[dict] = []
    with log_context(mm_hash="k"):
        worker = threading.Thread(target=lambda: seen.append(_line()))
        worker.start()
        worker.join()
        assert _line()["mm_hash"] == "k"
    assert seen == [{"event": "e"}]
