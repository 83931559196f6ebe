"""vLLM general plugin: registers `ECTierConnector` with vLLM's ECConnectorFactory."""

from __future__ import annotations

CONNECTOR_NAME = "ECTierConnector"


def register() -> None:
    """Called by vLLM in every process it starts; idempotent."""
    from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory

    if CONNECTOR_NAME not in ECConnectorFactory._registry:
        ECConnectorFactory.register_connector(
            CONNECTOR_NAME, "ec_connector.entrypoints.vllm.connector", CONNECTOR_NAME
        )
