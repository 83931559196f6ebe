"""ARC counted in blocks: a candidate of bench/eviction.py, not shipped (docs/eviction.md).

After Megiddo and Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache" (FAST '03). Two LRU
lists of resident entries, T1 (seen once since it entered) and T2 (read again, or brought back from
a ghost), and two ghost lists of evicted keys, B1 (evicted from T1) and B2 (from T2). A target
`p` (blocks) says how much of the region T1 should hold: a reservation of a key in B1 (T1 let it
go too early) raises `p` by its rows times max(1, |B2| / |B1|), one of a key in B2 lowers it by
its rows times max(1, |B1| / |B2|). A victim comes from T1's LRU end while T1 holds more than
`p` blocks, from T2's otherwise (the other list when the chosen one has no evictable entry).
|T1| + |B1| stays within the region, all four within twice it, every size in blocks.

Unlike `lecar`'s weights, `p` learns from every reservation of a ghost key whichever list evicted
it (full information: both lists' mistakes are seen as they happen), so its learning does not
depend on which list was followed. Held entries met at a list's end go to its MRU end (they go
round, as in the other policies). O(1) amortised: OrderedDicts, no scan.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Mapping

from ec_connector.domain.entries import Entry

_T1, _T2 = 1, 2


class ArcPolicy:
    """ARC in blocks (module docstring). `p_start`: T1's target at first, a share of the region."""

    name = "arc"

    def __init__(self, num_blocks: int, evictable: Mapping[str, Entry], *, p_start: float = 0.0) -> None:
        self._evictable = evictable
        self._c = max(1, num_blocks)
        self._p = p_start * self._c
        self._lists: dict[int, OrderedDict[str, Entry]] = {_T1: OrderedDict(), _T2: OrderedDict()}
        self._rows = {_T1: 0, _T2: 0}
        self._ghosts: dict[int, OrderedDict[str, int]] = {_T1: OrderedDict(), _T2: OrderedDict()}
        self._ghost_rows = {_T1: 0, _T2: 0}
        self._where: dict[str, int] = {}  # resident key -> its list
        self._taken: dict[str, int] = {}  # victims not yet freed -> the list they left
        self._stamps: dict[str, int] = {}
        self._stamp = 0

    @property
    def t1_target(self) -> float:
        """T1's target in blocks (`p`)."""
        return self._p

    def reserved(self, entry: Entry) -> None:
        key, rows = entry.key, entry.rows
        b1, b2 = self._ghost_rows[_T1], self._ghost_rows[_T2]
        if key in self._ghosts[_T1]:
            self._p = min(float(self._c), self._p + rows * max(1.0, b2 / max(1, b1)))
            self._forget(_T1, key)
            self._put(_T2, entry)
        elif key in self._ghosts[_T2]:
            self._p = max(0.0, self._p - rows * max(1.0, b1 / max(1, b2)))
            self._forget(_T2, key)
            self._put(_T2, entry)
        else:
            self._put(_T1, entry)
        self._trim()

    def listed(self, entry: Entry) -> None:
        pass  # resident since its reservation; evictability is read from `evictable`

    def read(self, entry: Entry) -> None:
        where = self._where.get(entry.key)
        if where is not None:
            self._drop(where, entry.key)
            self._put(_T2, entry)

    def freed(self, entry: Entry) -> None:
        where = self._where.get(entry.key)
        if where is not None:  # dropped (a failed save, quarantine): no ghost, it was not a choice
            self._drop(where, entry.key)
        came_from = self._taken.pop(entry.key, None)
        if came_from is not None:
            self._ghosts[came_from][entry.key] = entry.rows
            self._ghost_rows[came_from] += entry.rows
            self._trim()

    def victims(self, needed: int, protect: Container[str]) -> list[Entry]:
        out: list[Entry] = []
        while needed > 0:
            first = _T1 if self._rows[_T1] > self._p else _T2
            entry = self._lru(first, protect) or self._lru(_T2 if first == _T1 else _T1, protect)
            assert entry is not None, "victims() called with too few evictable blocks"
            where = self._where[entry.key]
            self._drop(where, entry.key)
            self._taken[entry.key] = where
            out.append(entry)
            needed -= entry.rows
        return out

    def queued(self) -> int:
        return len(self._lists[_T1]) + len(self._lists[_T2])

    def rank(self, entry: Entry) -> tuple[int, int]:
        first = _T1 if self._rows[_T1] > self._p else _T2
        return (0 if self._where.get(entry.key) == first else 1, self._stamps.get(entry.key, 0))

    # --- internals -----------------------------------------------------------------------------

    def _put(self, where: int, entry: Entry) -> None:
        self._lists[where][entry.key] = entry
        self._rows[where] += entry.rows
        self._where[entry.key] = where
        self._stamp += 1
        self._stamps[entry.key] = self._stamp

    def _drop(self, where: int, key: str) -> None:
        entry = self._lists[where].pop(key)
        self._rows[where] -= entry.rows
        del self._where[key]
        self._stamps.pop(key, None)

    def _forget(self, ghost: int, key: str) -> None:
        self._ghost_rows[ghost] -= self._ghosts[ghost].pop(key)

    def _lru(self, where: int, protect: Container[str]) -> Entry | None:
        """The least recently used evictable entry of list `where`; held ones go to its MRU end."""
        lst, evictable = self._lists[where], self._evictable
        for _ in range(len(lst)):
            key, entry = next(iter(lst.items()))
            if evictable.get(key) is entry and key not in protect:
                return entry
            lst.move_to_end(key)
            self._stamp += 1
            self._stamps[key] = self._stamp
        return None

    def _trim(self) -> None:
        """|T1| + |B1| within the region, all four lists within twice it (ARC's directory)."""
        while self._ghosts[_T1] and self._rows[_T1] + self._ghost_rows[_T1] > self._c:
            _, rows = self._ghosts[_T1].popitem(last=False)
            self._ghost_rows[_T1] -= rows
        while self._ghosts[_T2] and sum(self._rows.values()) + sum(self._ghost_rows.values()) > 2 * self._c:
            _, rows = self._ghosts[_T2].popitem(last=False)
            self._ghost_rows[_T2] -= rows
