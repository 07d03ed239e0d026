"""The frontend adapters' tests run real gateways as the integration tests do, with the same
fixtures."""

from tests.integration.conftest import connect, db_path, gateway, gateway_factory, processes

__all__ = ["connect", "db_path", "gateway", "gateway_factory", "processes"]
