"""The uvicorn server of a gateway: its configuration, the limits and guards on connections that
are of no use yet, `serve --workers N`, and the metrics listener of its own."""
