"""Tenant scoping on the step thread: the entry key each vLLM hook must use.

vLLM hands the connector a `Request` (which carries `cache_salt`) in `ensure_cache_available`,
`update_state_after_alloc` and `request_finished`, but only an identifier in `has_cache_item`.
vLLM's scheduler calls `ensure_cache_available(request)` and then, for that same request and
before any other request's, `has_cache_item` for its items (vLLM 0.32 and 0.33: docs/fleet.md
names the lines). So `RequestScopes` remembers the request last seen by `ensure` and answers
`has_cache_item` with that request's keys; an identifier that is not one of that request's items
gets no key, and the lookup is a miss: never a hit under a scope that was not checked.
"""

from __future__ import annotations

from collections.abc import Iterable

from ec_connector.domain.scope import Scope, entry_key, scope_of

SCOPE_CACHE = 4096
"""Salts whose scope is kept, so a salt's digest is computed once (the oldest forgotten first)."""


class RequestScopes:
    """Entry keys of vLLM's items under their requests' scopes; step thread only.

    `scoped=False` (`tenant_scopes` off) gives every request vLLM's identifiers as keys, salted or
    not, and answers the hooks the same way otherwise."""

    def __init__(self, *, secret: bytes | None = None, scoped: bool = True) -> None:
        self._secret = secret
        self._scoped = scoped
        self._scopes: dict[str, Scope | None] = {}
        self._current: dict[str, str] = {}

    def scope(self, cache_salt: str | None) -> Scope | None:
        """The scope of requests salted with `cache_salt` (None: unscoped)."""
        if not cache_salt or not self._scoped:
            return None
        scope = self._scopes.get(cache_salt)
        if scope is None:
            if len(self._scopes) >= SCOPE_CACHE:
                del self._scopes[next(iter(self._scopes))]
            scope = self._scopes[cache_salt] = scope_of(cache_salt, secret=self._secret)
        return scope

    def key(self, cache_salt: str | None, identifier: str) -> str:
        """The entry key of item `identifier` of a request salted with `cache_salt`."""
        return entry_key(identifier, self.scope(cache_salt))

    def enter(self, cache_salt: str | None, identifiers: Iterable[str]) -> dict[str, str]:
        """A request is being scheduled (`ensure_cache_available`): its items' keys by identifier,
        which `lookup` answers until the next request enters."""
        scope = self.scope(cache_salt)
        self._current = {identifier: entry_key(identifier, scope) for identifier in identifiers}
        return self._current

    def lookup(self, identifier: str) -> str | None:
        """The key `has_cache_item(identifier)` must look up, or None (answer a miss): None when
        `identifier` is not an item of the request that entered last."""
        return self._current.get(identifier)
