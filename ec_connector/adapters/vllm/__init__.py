"""The former module path of the vLLM connector, kept so that deployed configs keep loading it:

    {"ec_connector": "ECTierConnector", "ec_connector_module_path": "ec_connector.adapters.vllm"}

loads the same class as the documented path `ec_connector.entrypoints.vllm`. Nothing else lives here.
"""

from ec_connector.entrypoints.vllm import ECTierConnector

__all__ = ["ECTierConnector"]
