"""The vLLM facade: `ECTierConnector`, loadable by vLLM's ECConnectorFactory.

    {"ec_connector": "ECTierConnector", "ec_connector_module_path": "ec_connector.adapters.vllm"}

The package's `vllm.general_plugins` entry point registers the name, so the module path may be
omitted once the package is installed.
"""

from ec_connector.adapters.vllm.connector import ECTierConnector

__all__ = ["ECTierConnector"]
