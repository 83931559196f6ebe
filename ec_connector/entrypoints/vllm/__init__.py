"""The vLLM entry point: `ECTierConnector`, loadable by vLLM's ECConnectorFactory.

    {"ec_connector": "ECTierConnector", "ec_connector_module_path": "ec_connector.entrypoints.vllm"}

The package's `vllm.general_plugins` entry point (plugin.py) registers the name, so the module path
may be omitted once the package is installed. Configs that name the former path
`ec_connector.adapters.vllm` load the same class.
"""

from ec_connector.entrypoints.vllm.connector import ECTierConnector

__all__ = ["ECTierConnector"]
