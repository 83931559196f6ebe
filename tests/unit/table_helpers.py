"""What the entry table's tests share: the leases they use, a table, a ready entry, the keys in order."""

from __future__ import annotations

from ec_connector.domain.cache import EntryTable

LEASE = 30.0
Q = 60.0


def table_of(num_blocks: int = 10) -> EntryTable:
    """An empty table of `num_blocks` blocks, no run floor nor cap."""
    return EntryTable(num_blocks)


def put_ready(table: EntryTable, key: str, rows: int, now: float = 0.0) -> None:
    """Reserve `key` (it must fit) and mark it ready."""
    res = table.reserve(key, rows, now=now, lease_s=LEASE)
    assert res is not None
    table.mark_ready(key)


def keys_of(table: EntryTable) -> list[str]:
    """The table's keys in reservation order."""
    return [e.key for e in table.entries()]


def request(table: EntryTable, key: str, rows: int = 1) -> bool:
    """One request of `key`: a hit reads it (pin, unpin), a miss reserves it and marks it ready.
    True on a hit."""
    if key in table:
        table.pin(key)
        table.unpin(key)
        return True
    put_ready(table, key, rows)
    return False


def hot_among_one_offs(table: EntryTable, hot: list[str], requests: int = 400) -> int:
    """Stationary popularity: a hot key every other request (in turn), a key never seen again in
    between. LRU would evict hot keys that come back; LFU evicts the one-offs. The hot keys' hits."""
    hits = 0
    for n in range(requests):
        hits += request(table, hot[n % len(hot)])
        request(table, f"once{n}")
    return hits
