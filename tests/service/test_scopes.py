"""Tenant scopes through the local tier: the hooks' keys from `RequestScopes`, driven in vLLM's order
(`ensure_cache_available(request)`, then `has_cache_item(identifier)` for that request's items)."""

from __future__ import annotations

from ec_connector.application.scoping import SCOPE_CACHE, RequestScopes
from ec_connector.domain.scope import identifier_of, scope_of

from .conftest import Engine, encoder_output


def serve(engine: Engine, scopes: RequestScopes, salt: str | None, identifier: str, rows: int):
    """One request of one item as vLLM's scheduler hooks see it; what the step loaded or encoded."""
    keys = scopes.enter(salt, [identifier])
    key = scopes.lookup(identifier)
    assert key == keys[identifier]
    result = engine.step([(key, rows)])
    engine.settle()
    return key, result


def test_an_item_is_reloaded_only_by_requests_of_the_scope_that_stored_it():
    engine, scopes = Engine(), RequestScopes()
    stored, first = serve(engine, scopes, "tenant-1", "img", 4)
    assert first.encoded == [stored]
    _, same = serve(engine, scopes, "tenant-1", "img", 4)
    assert same.encoded == [] and same.loaded[stored] == encoder_output(stored, 4)
    for other in ("tenant-2", None):
        key, result = serve(engine, scopes, other, "img", 4)
        assert result.encoded == [key] and result.loaded == {}, other
    assert len(engine.scheduler.entries()) == 3
    assert {identifier_of(e.key) for e in engine.scheduler.entries()} == {"img"}


def test_unsalted_requests_keep_vllms_identifiers_as_keys():
    scopes = RequestScopes()
    assert scopes.enter(None, ["abc"]) == {"abc": "abc"}
    assert scopes.enter("", ["abc"]) == {"abc": "abc"}


def test_a_lookup_for_an_item_of_another_request_is_a_miss():
    scopes = RequestScopes()
    scopes.enter("tenant-1", ["a"])
    scopes.enter("tenant-2", ["b"])
    assert scopes.lookup("a") is None
    assert scopes.lookup("b") == scopes.key("tenant-2", "b")


def test_replicas_with_the_same_secret_agree_on_keys_and_others_do_not():
    one, two, other = RequestScopes(secret=b"s"), RequestScopes(secret=b"s"), RequestScopes(secret=b"t")
    assert one.key("tenant-1", "img") == two.key("tenant-1", "img") != other.key("tenant-1", "img")


def test_the_salt_cache_is_bounded_and_stays_correct_past_its_bound():
    scopes = RequestScopes()
    for n in range(SCOPE_CACHE + 10):
        assert scopes.scope(f"salt-{n}") == scope_of(f"salt-{n}")
    assert len(scopes._scopes) == SCOPE_CACHE
    assert scopes.scope("salt-0") == scope_of("salt-0")


def test_one_item_encoded_once_is_saved_under_every_scope_that_asked_for_it_in_the_step():
    """vLLM encodes an identifier once per step whatever the salts; the worker saves that one
    payload to each entry key planned for it, and reloads land under vLLM's identifier."""
    engine, scopes = Engine(), RequestScopes()
    one, two = scopes.key("tenant-1", "img"), scopes.key("tenant-2", "img")
    plan_items = [(one, 4), (two, 4)]
    for key, rows in plan_items:
        assert not engine.scheduler.has_item(key)
        engine.scheduler.on_allocated(key, rows)
    plan = engine.scheduler.take_plan()
    worker = engine.workers[0]
    worker.bind(plan)
    worker.save({"img": encoder_output("img", 4)}, "img")
    worker.clear()
    engine.settle()
    assert {e.key for e in engine.scheduler.entries() if engine.scheduler.is_ready(e.key)} == {one, two}
    for key in (one, two):
        assert engine.scheduler.has_item(key)
        engine.scheduler.on_allocated(key, 4)
        plan = engine.scheduler.take_plan()
        cache: dict[str, object] = {}
        worker.bind(plan)
        worker.start_loads(cache)
        worker.clear()
        assert list(cache) == ["img"] and cache["img"] == encoder_output("img", 4)
