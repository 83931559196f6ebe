"""What differs between the vLLM versions the connector runs on, read in one place.

Supported: vLLM 0.32 (the CPU build, V1 model runner) and vLLM 0.33 (the CUDA build, V2 model
runner by default, V1 with ``VLLM_USE_V2_MODEL_RUNNER=0``). The connector API the facade implements
(``ECConnectorBase``'s hooks and their arguments) is the same in both; what moved is read here with
a default for the version that lacks it, so the rest of the package never asks which version runs.
"""

from __future__ import annotations

from typing import Any

from ec_connector.domain.errors import ConfigError

SUPPORTED = ("0.32", "0.33")


def series(version: str) -> str:
    """The `major.minor` series of a vLLM version string (`0.33.0rc1` -> `0.33`)."""
    parts = version.split(".")
    if len(parts) < 2 or not parts[0].isdigit():
        raise ValueError(f"not a vLLM version: {version!r}")
    minor = "".join(c for c in parts[1] if c.isdigit())
    return f"{parts[0]}.{minor}"


def is_supported(version: str) -> bool:
    return series(version) in SUPPORTED


def measured_encoder_widths(vllm_config: Any) -> dict[str, int]:
    """Per-modality encoder-output widths vLLM measured by encoding a dummy item, or {}.

    vLLM measures them only for producers (``ec_producer``, ``ec_both``), after the model is loaded
    and before the scheduler-side connector is built; worker-side connectors (built earlier) and
    consumers see {}. A version without the field gives {} too.
    """
    ec = vllm_config.ec_transfer_config
    widths = getattr(ec, "mm_encoder_output_widths", None) or {}
    return {str(modality): int(width) for modality, width in widths.items()}


def check_row_width(vllm_config: Any, hidden_dim: int) -> None:
    """Fail at start when vLLM measured an encoder-output width other than the tier's row width.

    The tier keeps one row width, computed from the model config on every process of the instance
    (workers are built before vLLM measures, consumers never measure), so the measurement can only
    confirm it: a model whose encoder emits other widths would fail every save and load.
    """
    widths = measured_encoder_widths(vllm_config)
    wrong = {modality: width for modality, width in widths.items() if width != hidden_dim}
    if wrong:
        raise ConfigError(
            f"vLLM measured encoder-output widths {dict(sorted(widths.items()))} for this model, but "
            f"the tier's row width from the model config is {hidden_dim} "
            f"(modalities {sorted(wrong)} differ); ECTierConnector keeps one row width per region, "
            "so this model's encoder outputs cannot be stored: run it without the connector"
        )
