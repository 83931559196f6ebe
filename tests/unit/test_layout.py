"""Region layout: row width (incl. deepstack), block size, block count, byte runs, fingerprint."""

from __future__ import annotations

import re

import pytest

from ec_connector.domain.blocks import Extent
from ec_connector.domain.errors import ConfigError
from ec_connector.domain.layout import DTYPE_ITEMSIZE, Layout, fingerprint, model_hidden_dim


def test_hidden_dim_is_the_input_embedding_width_for_plain_models():
    assert model_hidden_dim(3584) == 3584
    assert model_hidden_dim(3584, vision_out_hidden=1280) == 3584


def test_hidden_dim_of_a_deepstack_model_concatenates_each_deepstack_layer():
    assert model_hidden_dim(2048, vision_out_hidden=2048, deepstack_indexes=[5, 11, 17]) == 8192
    assert model_hidden_dim(4096, vision_out_hidden=2560, deepstack_indexes=(8,)) == 5120


def test_deepstack_model_without_vision_out_hidden_is_rejected():
    with pytest.raises(ValueError, match="a deepstack model needs vision_config.out_hidden_size"):
        model_hidden_dim(2048, deepstack_indexes=[5])


@pytest.mark.parametrize(("text", "vision", "deepstack"), [(0, None, ()), (-4, None, ()), (2048, 0, (1, 2))])
def test_non_positive_hidden_dim_is_rejected(text, vision, deepstack):
    with pytest.raises(ValueError, match="hidden_dim must be > 0"):
        model_hidden_dim(text, vision_out_hidden=vision, deepstack_indexes=deepstack)


@pytest.mark.parametrize(
    ("dtype", "itemsize"),
    [("float32", 4), ("float16", 2), ("bfloat16", 2), ("float8_e4m3fn", 1), ("float8_e5m2", 1)],
)
def test_block_size_is_hidden_dim_times_dtype_itemsize(dtype, itemsize):
    layout = Layout(hidden_dim=3584, dtype=dtype, num_blocks=10)
    assert layout.itemsize == itemsize
    assert layout.block_size_bytes == 3584 * itemsize
    assert layout.data_bytes == 10 * 3584 * itemsize


@pytest.mark.parametrize(("nbytes", "blocks"), [(0, 1), (1, 1), (7168, 1), (7169, 2), (262144, 37)])
def test_blocks_for_is_the_fewest_whole_blocks_holding_the_bytes_and_at_least_one(nbytes, blocks):
    assert Layout(hidden_dim=3584, dtype="bfloat16", num_blocks=10).blocks_for(nbytes) == blocks


def test_blocks_for_a_negative_size_is_a_caller_error():
    with pytest.raises(ValueError, match="cannot size -1 bytes"):
        Layout(hidden_dim=8, dtype="bfloat16", num_blocks=10).blocks_for(-1)


def test_every_supported_dtype_is_listed():
    assert set(DTYPE_ITEMSIZE) == {"float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}


def test_num_blocks_is_the_budget_floored_to_whole_blocks():
    layout = Layout.for_budget(10_000, hidden_dim=1024, dtype="bfloat16")  # 2048-byte blocks
    assert layout == Layout(hidden_dim=1024, dtype="bfloat16", num_blocks=4)
    assert layout.data_bytes == 8192


def test_budget_of_exactly_one_block_gives_one_block():
    layout = Layout.for_budget(2048, hidden_dim=1024, dtype="bfloat16")
    assert layout.num_blocks == 1


def test_one_gib_of_3584_wide_bf16_rows():
    layout = Layout.for_budget(1 << 30, hidden_dim=3584, dtype="bfloat16")
    assert layout.block_size_bytes == 7168
    assert layout.num_blocks == (1 << 30) // 7168 == 149796


def test_budget_smaller_than_one_block_is_a_config_error():
    expected = (
        "ec_connector_extra_config['ec_cpu_bytes'] = 2047 is smaller than one block "
        "(2048 bytes = hidden_dim 1024 × bfloat16); expected an integer >= 2048"
    )
    with pytest.raises(ConfigError, match=re.escape(expected)) as info:
        Layout.for_budget(2047, hidden_dim=1024, dtype="bfloat16")
    assert isinstance(info.value, ValueError)


def test_budget_with_unknown_dtype_is_a_value_error():
    with pytest.raises(ValueError, match=r"dtype 'int4' is not one of"):
        Layout.for_budget(1 << 20, hidden_dim=1024, dtype="int4")


@pytest.mark.parametrize("hidden_dim", [0, -8])
def test_budget_with_non_positive_hidden_dim_is_a_value_error(hidden_dim):
    with pytest.raises(ValueError, match=f"hidden_dim must be > 0, got {hidden_dim}"):
        Layout.for_budget(1 << 20, hidden_dim=hidden_dim, dtype="bfloat16")


def test_layout_rejects_unknown_dtype():
    with pytest.raises(ValueError, match=r"dtype 'float64' is not one of \['bfloat16', 'float16'"):
        Layout(hidden_dim=8, dtype="float64", num_blocks=1)


@pytest.mark.parametrize(("hidden_dim", "num_blocks"), [(0, 1), (8, 0), (-1, 5)])
def test_layout_rejects_empty_rows_or_regions(hidden_dim, num_blocks):
    with pytest.raises(ValueError, match="layout needs hidden_dim > 0 and num_blocks > 0"):
        Layout(hidden_dim=hidden_dim, dtype="float16", num_blocks=num_blocks)


def test_byte_runs_are_offset_and_length_of_each_extent():
    layout = Layout(hidden_dim=1024, dtype="bfloat16", num_blocks=100)
    runs = layout.byte_runs([Extent(0, 3), Extent(10, 1), Extent(50, 7)])
    assert runs == ((0, 6144), (20480, 2048), (102400, 14336))
    assert layout.byte_runs(()) == ()


FP = {"vllm_version": "0.32.0", "model": "Qwen/Qwen3-VL-4B", "dtype": "bfloat16", "block_size_bytes": 16384}


def test_fingerprint_is_a_stable_sha256_hex():
    a = fingerprint(**FP)
    assert a == fingerprint(**dict(FP))
    assert re.fullmatch(r"[0-9a-f]{64}", a)


@pytest.mark.parametrize(
    ("field", "other"),
    [
        ("vllm_version", "0.32.1"),
        ("model", "Qwen/Qwen3-VL-8B"),
        ("dtype", "float16"),
        ("block_size_bytes", 8192),
    ],
)
def test_fingerprint_changes_with_each_of_its_inputs(field, other):
    assert fingerprint(**{**FP, field: other}) != fingerprint(**FP)


def test_fingerprint_fields_cannot_bleed_into_each_other():
    a = fingerprint(vllm_version="1", model="2x", dtype="bfloat16", block_size_bytes=4)
    b = fingerprint(vllm_version="12", model="x", dtype="bfloat16", block_size_bytes=4)
    assert a != b
