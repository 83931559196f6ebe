"""Region layout: row width, block size, block count; and the compatibility fingerprint."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from ec_connector.domain.blocks import Extent
from ec_connector.domain.errors import ConfigError

DTYPE_ITEMSIZE: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def model_hidden_dim(
    text_hidden: int,
    *,
    vision_out_hidden: int | None = None,
    deepstack_indexes: Sequence[int] = (),
) -> int:
    """Width of one encoder-output row.

    The input-embedding width, except for deepstack models (Qwen3-VL), whose encoder output
    concatenates the main embedding and one per deepstack layer:
    `vision_out_hidden × (1 + len(deepstack_indexes))`.
    """
    if deepstack_indexes:
        if vision_out_hidden is None:
            raise ValueError("a deepstack model needs vision_config.out_hidden_size")
        width = vision_out_hidden * (1 + len(deepstack_indexes))
    else:
        width = text_hidden
    if width <= 0:
        raise ValueError(f"hidden_dim must be > 0, got {width}")
    return width


@dataclass(frozen=True, slots=True)
class Layout:
    """How rows of `hidden_dim` elements of `dtype` are laid out as blocks."""

    hidden_dim: int
    dtype: str
    num_blocks: int

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_ITEMSIZE:
            raise ValueError(f"dtype {self.dtype!r} is not one of {sorted(DTYPE_ITEMSIZE)}")
        if self.hidden_dim <= 0 or self.num_blocks <= 0:
            raise ValueError(f"layout needs hidden_dim > 0 and num_blocks > 0, got {self}")

    @classmethod
    def for_budget(cls, cpu_bytes: int, *, hidden_dim: int, dtype: str) -> Layout:
        """The layout of a region of at most `cpu_bytes` data bytes (whole blocks only)."""
        if dtype not in DTYPE_ITEMSIZE:
            raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPE_ITEMSIZE)}")
        if hidden_dim <= 0:
            raise ValueError(f"hidden_dim must be > 0, got {hidden_dim}")
        block = hidden_dim * DTYPE_ITEMSIZE[dtype]
        if cpu_bytes < block:
            raise ConfigError(
                f"ec_connector_extra_config['ec_cpu_bytes'] = {cpu_bytes} is smaller than one "
                f"block ({block} bytes = hidden_dim {hidden_dim} × {dtype}); expected an integer "
                f">= {block}"
            )
        return cls(hidden_dim=hidden_dim, dtype=dtype, num_blocks=cpu_bytes // block)

    @property
    def itemsize(self) -> int:
        return DTYPE_ITEMSIZE[self.dtype]

    @property
    def block_size_bytes(self) -> int:
        return self.hidden_dim * self.itemsize

    @property
    def data_bytes(self) -> int:
        return self.num_blocks * self.block_size_bytes

    def blocks_for(self, nbytes: int) -> int:
        """The fewest blocks (at least 1) that hold `nbytes` bytes."""
        if nbytes < 0:
            raise ValueError(f"cannot size {nbytes} bytes")
        return max(1, -(-nbytes // self.block_size_bytes))

    def byte_runs(self, extents: Sequence[Extent]) -> tuple[tuple[int, int], ...]:
        """(byte offset, byte length) of each extent within the data area."""
        b = self.block_size_bytes
        return tuple((e.start * b, e.length * b) for e in extents)


def fingerprint(*, vllm_version: str, model: str, dtype: str, block_size_bytes: int) -> str:
    """SHA-256 over what must match for a producer's bytes to be valid in a consumer."""
    text = "\x1f".join((vllm_version, model, dtype, str(block_size_bytes)))
    return hashlib.sha256(text.encode()).hexdigest()
