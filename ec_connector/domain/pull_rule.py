"""When a fleet pull beats encoding: the rule `FleetFetcher` asks before it pulls an item from a peer.

Pure arithmetic on the item's size and rows and on measured figures (docs/fleet.md): a pull costs
a fixed round trip plus its bytes over the link's READ rate; encoding costs the encoder's time per
row. The rule lives in the domain so that the fetcher, the container's config and the benches
share one definition.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class PullRule:
    """When pulling an item from a peer beats encoding it here: `read_s(bytes) <= margin *
    rows * encode_s_per_row`, where `read_s(bytes) = fixed_s + bytes / bytes_per_s`.

    Defaults (docs/fleet.md gives the measurements): `fixed_s` 1.5 ms, the XferReq/XferAck round
    trip and READ setup of a 1 MiB item end to end between two processes of one host
    (`bench/compare_p2p.py`: 1.50-1.77 ms); `bytes_per_s` 3.5 GiB/s, a 9 MiB READ's phase on one
    host (2.4-2.75 ms); `encode_s_per_row` 10 µs, a 7B-sized Qwen2-VL's vision encoder on the H200
    (serving bench, repeat pass without a tier against the encoder stubbed: 0.77 s over 96 items of
    768 rows). Across hosts set `bytes_per_s` to the link's measured READ rate.
    """

    encode_s_per_row: float = 10e-6
    fixed_s: float = 1.5e-3
    bytes_per_s: float = 3.5 * GIB
    margin: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(f"pull rule {f.name} = {value!r} must be a number >= 0")
        if self.bytes_per_s <= 0:
            raise ValueError(f"pull rule bytes_per_s = {self.bytes_per_s!r} must be > 0")

    def read_s(self, size_bytes: int) -> float:
        """Predicted seconds to pull `size_bytes` from a peer."""
        return self.fixed_s + size_bytes / self.bytes_per_s

    def worth(self, size_bytes: int, rows: int) -> bool:
        """True when pulling the item (`rows` rows, `size_bytes`) is predicted to cost at most
        `margin` times encoding it."""
        return self.read_s(size_bytes) <= self.margin * rows * self.encode_s_per_row

    def break_even_rows(self, row_bytes: int) -> int | None:
        """The fewest rows of `row_bytes` each from which a pull is worth it; None when never (the
        link moves a row slower than the encoder makes one)."""
        per_row = self.margin * self.encode_s_per_row - row_bytes / self.bytes_per_s
        if per_row <= 0:
            return None
        rows = max(1, int(self.fixed_s / per_row))
        while not self.worth(rows * row_bytes, rows):
            rows += 1
        return rows
