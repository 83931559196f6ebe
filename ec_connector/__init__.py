"""ec_connector: an encoder-cache connector for vLLM multimodal serving.

Importing the package imports nothing heavy; the vLLM facade lives in
`ec_connector.entrypoints.vllm` and the composition root in `ec_connector.container`.
"""

__version__ = "0.1.0"
