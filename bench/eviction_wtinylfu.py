"""W-TinyLFU with a hill-climbing window (Caffeine's policy), counted in blocks: an eviction
candidate for bench/eviction.py. After Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient
Cache Admission Policy" (ACM ToS 2017) and Einziger, Eytan, Friedman and Manes, "Adaptive Software
Cache Management" (Middleware '18), as Caffeine runs it:

- a new entry joins a small **window** (LRU; 1% of the region at first) when it first becomes READY;
- the rest of the region is the **main** region, a segmented LRU: **probation** (where entries
  admitted from the window land) and **protected** (80% of the main region; a read in probation
  promotes an entry there, and the protected LRU end is demoted back to probation's MRU end when
  it is over its share);
- while the window holds more than its share, its LRU entry (the candidate) meets the main
  region's victim (probation's LRU end; protected's, then the window's, when probation is empty):
  the one a `FrequencySketch` (count-min, 4-bit counters halved periodically) has seen less often
  is evicted, the candidate losing ties; a winning candidate moves to probation's MRU end;
- **hill climbing** moves the window's share: every `sample x entries held` requests (reads are
  hits, reservations misses) the sample's hit ratio is compared with the previous sample's; if it
  did not fall the window moves again by the step in the same direction, otherwise in the other;
  the step starts at 6.25% of the region (shrinking the window first), decays by 2% a sample, and
  restarts at 6.25% when the hit ratio moved by 5 points or more.

Differences from Caffeine, for the table: sizes are blocks; an entry held by the table (pinned,
granted, announced, protected by the caller) met at a queue's end goes to that queue's MRU end
instead of being evicted; the window and protected shares change lazily (a share that shrank is
given back by the next evictions, Caffeine moves entries at once); no random admission of a
candidate with a high count (Caffeine's guard against hash flooding), so a replay is reproducible.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Container, Mapping

from bench.eviction_candidates import FrequencySketch
from ec_connector.domain.entries import Entry

WINDOW_SHARE = 0.01  # Caffeine's initial window: 1% of the region
PROTECTED_SHARE = 0.80  # of the main region
MAX_WINDOW_SHARE = 0.80  # the climber keeps the window between 0 and this share of the region
STEP_SHARE = 0.0625  # the climber's step: 6.25% of the region
STEP_DECAY = 0.98  # the step shrinks by 2% a sample while the hit ratio holds
RESTART = 0.05  # a sample whose hit ratio moved by this much restarts the step at its full size
SAMPLE = 10.0  # a sample: this many x the entries held requests (Caffeine: 10 x the maximum)

_WINDOW, _PROBATION, _PROTECTED = 0, 1, 2
_RANK = {_PROBATION: 0, _WINDOW: 1, _PROTECTED: 2}  # `rank`: probation first, protected last


class EntrySketch(FrequencySketch):
    """`FrequencySketch` whose counters are halved after `sample x entries held` additions, as
    Caffeine's (10 x the cache's maximum entries), instead of after `10 x its width`."""

    def __init__(self, sample: float) -> None:
        super().__init__()
        self._per_entry = sample

    def track(self, keys: int) -> None:
        super().track(keys)
        self._sample = max(64, int(self._per_entry * keys))


class _Place:
    """An entry's place: its queue (None: not READY yet, in no queue), and whether it is a
    candidate (it left the window for probation and has not moved since)."""

    __slots__ = ("entry", "queue", "candidate")

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        self.queue: int | None = None
        self.candidate = False


class WTinyLfuPolicy:
    """W-TinyLFU with a hill-climbing window (module docstring). Every operation is O(1)
    amortised: the three queues are OrderedDicts (move to the MRU end, pop the LRU end), a victim
    passes only the held entries at the queues' ends, and a sample's adjustment is O(1)."""

    name = "wtinylfu"

    def __init__(
        self,
        num_blocks: int,
        evictable: Mapping[str, Entry],
        *,
        window_share: float = WINDOW_SHARE,
        protected_share: float = PROTECTED_SHARE,
        max_window_share: float = MAX_WINDOW_SHARE,
        step_share: float = STEP_SHARE,
        step_decay: float = STEP_DECAY,
        restart: float = RESTART,
        sample: float = SAMPLE,
        sketch_sample: float = 10.0,
        climb: bool = True,
    ) -> None:
        self._evictable = evictable
        self._num_blocks = num_blocks
        self._places: dict[str, _Place] = {}
        self._queues: tuple[OrderedDict[str, _Place], ...] = (OrderedDict(), OrderedDict(), OrderedDict())
        self._rows = [0, 0, 0]
        self._candidates: deque[_Place] = deque()  # left the window, not judged yet, oldest first
        self._protected_share = protected_share
        self._max_window = max_window_share * num_blocks
        self._window = window_share * num_blocks  # the window's target, blocks (a float: steps are)
        self.sketch = EntrySketch(sketch_sample)
        self._climb = climb
        self._sample_factor = sample
        self._step = -step_share * num_blocks  # Caffeine's first move shrinks the window
        self._full_step = step_share * num_blocks
        self._decay = step_decay
        self._restart = restart
        self._hits = self._misses = 0
        self._previous = 0.0  # the previous sample's hit ratio

    @property
    def window_share(self) -> float:
        """The window's target share of the region (0 to `max_window_share`)."""
        return self._window / max(1, self._num_blocks)

    def reserved(self, entry: Entry) -> None:
        self._places[entry.key] = _Place(entry)
        self.sketch.track(len(self._places))
        self.sketch.add(entry.key)
        self._misses += 1
        self._sampled()

    def listed(self, entry: Entry) -> None:
        place = self._places[entry.key]
        if place.queue is None:
            self._put(place, _WINDOW)
            self._overflow()

    def read(self, entry: Entry) -> None:
        self.sketch.add(entry.key)
        self._hits += 1
        place = self._places[entry.key]
        if place.queue == _PROBATION:
            self._take(place)
            self._put(place, _PROTECTED)
            self._demote()
        elif place.queue is not None:
            self._queues[place.queue].move_to_end(entry.key)
        self._sampled()

    def freed(self, entry: Entry) -> None:
        place = self._places.pop(entry.key)
        if place.queue is not None:
            self._take(place)

    def victims(self, needed: int, protect: Container[str]) -> list[Entry]:
        out: list[Entry] = []
        while needed > 0:
            place = self._next(needed, protect)
            assert place is not None, "victims() called with too few evictable blocks"
            self._take(place)
            out.append(place.entry)
            needed -= place.entry.rows
        return out

    def queued(self) -> int:
        return sum(len(q) for q in self._queues)

    def rank(self, entry: Entry) -> tuple[int, int]:
        # probation first, then the window, then protected; LRU first within each (the table's
        # queue number is the time of the last release)
        place = self._places[entry.key]
        order = {_PROBATION: 0, _WINDOW: 1, _PROTECTED: 2}.get(
            place.queue if place.queue is not None else 0, 0
        )
        return (order, entry.order)

    # --- internals -----------------------------------------------------------------------------

    def _next(self, needed: int, protect: Container[str]) -> _Place | None:
        """The next victim, left in its queue (the caller takes it). The oldest candidate not yet
        judged (an entry that left the window for probation) meets probation's LRU entry: the one
        seen less often goes, the candidate losing ties. With none pending, the window's LRU entry
        becomes one if the window would be over its share once the entry being reserved
        (`needed` blocks) joins it (Caffeine adds the new entry first, then evicts). With no
        candidate: probation's LRU entry, then protected's, then the window's."""
        candidates, estimate = self._candidates, self.sketch.estimate
        while True:
            while candidates and not candidates[0].candidate:
                candidates.popleft()  # moved since, or freed
            if not candidates and self._rows[_WINDOW] + needed > self._window:
                self._overflow(limit=self._window - needed, keep=0)
            if not candidates:
                break
            place = candidates.popleft()
            place.candidate = False
            if not self._is_victim(place, protect):
                continue  # held: it stays (admitted)
            victim = self._lru(_PROBATION, protect)
            if victim is place or victim is None:
                victim = self._lru(_PROTECTED, protect)
            if victim is None or estimate(place.entry.key) <= estimate(victim.entry.key):
                return place
            return victim
        return self._lru(_PROBATION, protect) or self._lru(_PROTECTED, protect) or self._lru(_WINDOW, protect)

    def _is_victim(self, place: _Place, protect: Container[str]) -> bool:
        return self._evictable.get(place.entry.key) is place.entry and place.entry.key not in protect

    def _lru(self, queue: int, protect: Container[str]) -> _Place | None:
        """`queue`'s least recently used evictable entry, left in place; held entries met on the
        way go to its MRU end. None when a whole round finds none."""
        q = self._queues[queue]
        for _ in range(len(q)):
            key, place = next(iter(q.items()))
            if self._is_victim(place, protect):
                return place
            q.move_to_end(key)
        return None

    def _put(self, place: _Place, queue: int) -> None:
        place.queue = queue
        self._queues[queue][place.entry.key] = place
        self._rows[queue] += place.entry.rows

    def _take(self, place: _Place) -> None:
        assert place.queue is not None
        del self._queues[place.queue][place.entry.key]
        self._rows[place.queue] -= place.entry.rows
        place.queue = None
        place.candidate = False

    def _overflow(self, limit: float | None = None, keep: int = 1) -> None:
        """Window entries over `limit` blocks (its share) move to probation's MRU end, LRU first,
        as candidates, keeping at least `keep`: the next evictions judge them against
        probation's LRU entries (Caffeine's `evictFromWindow`; while no eviction is needed they
        stay, admitted)."""
        window, candidates = self._queues[_WINDOW], self._candidates
        limit = self._window if limit is None else limit
        while self._rows[_WINDOW] > limit and len(window) > keep:
            _, place = next(iter(window.items()))
            self._take(place)
            self._put(place, _PROBATION)
            place.candidate = True
            candidates.append(place)
        if len(candidates) > 64 + 2 * len(self._queues[_PROBATION]):
            live = [p for p in candidates if p.candidate]
            candidates.clear()
            candidates.extend(live)

    def _demote(self) -> None:
        """Protected entries over its share go to probation's MRU end, LRU first."""
        target = self._protected_share * (self._num_blocks - self._window)
        protected = self._queues[_PROTECTED]
        while self._rows[_PROTECTED] > target and len(protected) > 1:
            _, place = next(iter(protected.items()))
            self._take(place)
            self._put(place, _PROBATION)

    def _sampled(self) -> None:
        """A request was counted: at the end of a sample, climb (Caffeine's `determineAdjustment`)."""
        total = self._hits + self._misses
        if not self._climb or total < self._sample_factor * max(64, len(self._places)):
            return
        ratio = self._hits / total
        change = ratio - self._previous
        amount = self._step if change >= 0 else -self._step
        if abs(change) >= self._restart:
            self._step = self._full_step if amount >= 0 else -self._full_step
        else:
            self._step = self._decay * amount
        self._previous = ratio
        self._hits = self._misses = 0
        self._window = min(self._max_window, max(0.0, self._window + amount))
        self._demote()
