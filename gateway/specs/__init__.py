"""Machine-readable API descriptions, generated from the code that implements the API.

`openapi` describes the HTTP API, `asyncapi` the WebSocket protocol; `shapes` holds the
pydantic models of what the gateway sends that both documents share. The gateway serves both
documents (`serve`), and `python -m gateway.specs` writes them to docs/ (tests compare).
"""
