"""Metrics, traces and logs of a gateway (docs/operations.md), each created in the lifespan and
passed down."""
