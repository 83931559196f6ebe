"""Tenant scopes: the tier's entry key of an item, from vLLM's identifier and the request's scope.

vLLM gives an item the same identifier under every `cache_salt` (docs/fleet.md shows where), so
the connector scopes entries itself: a request's scope is a digest of its salt, and the entry key
joins scope and identifier. The map is injective, so an entry stored under one scope is never
found under another, and an unsalted request never reads a salted entry:

    unscoped, identifier not starting with "~"   ->  identifier            (today's keys, unchanged)
    unscoped, identifier starting with "~"       ->  "~" + identifier      (starts "~~": escaped)
    scoped                                       ->  "~" + scope + "~" + identifier

A scope is 32 lowercase hex characters (128 bits of a SHA-256), never "~", so the three forms
cannot meet. With a secret (the fleet's `side_channel_secret`) the digest is an HMAC, so an event
feed subscriber who guesses a tenant's salt still cannot recognise its entries.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import NewType

Scope = NewType("Scope", str)
"""A tenant scope: 32 lowercase hex characters."""

MARK = "~"
SCOPE_CHARS = 32
_HEX = frozenset("0123456789abcdef")
_PLAIN_DOMAIN = b"ec_connector scope\x00"


def scope_of(cache_salt: str | None, *, secret: bytes | None = None) -> Scope | None:
    """The scope of a request whose `cache_salt` is given; None for no salt (or an empty one,
    which vLLM treats as none). Every replica that shares entries must use the same `secret`."""
    if not cache_salt:
        return None
    salt = cache_salt.encode("utf-8", "surrogatepass")
    if secret:
        digest = hmac.new(secret, salt, hashlib.sha256).hexdigest()
    else:
        digest = hashlib.sha256(_PLAIN_DOMAIN + salt).hexdigest()
    return Scope(digest[:SCOPE_CHARS])


def is_scope(value: str) -> bool:
    """True when `value` has a scope's form (32 lowercase hex characters)."""
    return len(value) == SCOPE_CHARS and _HEX.issuperset(value)


def entry_key(identifier: str, scope: Scope | None) -> str:
    """The tier's key for item `identifier` requested under `scope` (None: unscoped)."""
    if not identifier:
        raise ValueError("an item identifier must not be empty")
    if scope is None:
        return MARK + identifier if identifier.startswith(MARK) else identifier
    if not is_scope(scope):
        raise ValueError(f"scope {scope!r} is not 32 lowercase hex characters (make it with scope_of)")
    return MARK + scope + MARK + identifier


def split_key(key: str) -> tuple[Scope | None, str]:
    """(scope, identifier) of an entry key made by `entry_key`; ValueError for any other string.

    A worker uses the identifier to find the item in vLLM's encoder cache, which is keyed by it.
    """
    if not key:
        raise ValueError("an entry key must not be empty")
    if not key.startswith(MARK):
        return None, key
    if key.startswith(MARK + MARK):
        return None, key[1:]
    scope, sep, identifier = (
        key[1 : 1 + SCOPE_CHARS],
        key[1 + SCOPE_CHARS : 2 + SCOPE_CHARS],
        key[2 + SCOPE_CHARS :],
    )
    if not is_scope(scope) or sep != MARK or not identifier:
        raise ValueError(f"entry key {key[:80]!r} starts with {MARK!r} but is neither escaped nor scoped")
    return Scope(scope), identifier


def identifier_of(key: str) -> str:
    """vLLM's identifier of the item stored under entry key `key`."""
    return split_key(key)[1]
