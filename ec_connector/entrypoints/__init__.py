"""Entry points: what starts the connector and reads its configuration.

`entrypoints.vllm` is the connector vLLM loads (`ECTierConnector`) and its plugin; `cli` is the
`ec-connector` command. Both sit above the container: they parse the settings once and ask the
container for the services of their role.
"""
