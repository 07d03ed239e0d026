"""Shared fixtures. Tests needing an external service use `require_service`."""

from __future__ import annotations

import os
import socket

import pytest

REQUIRE_SERVICES = os.environ.get("GATEWAY_REQUIRE_SERVICES") == "1"


def require_service(name: str, host: str, port: int) -> None:
    """Skip when the service is absent, unless GATEWAY_REQUIRE_SERVICES=1 (CI): then fail."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return
    except OSError:
        message = f"{name} is not reachable on {host}:{port}"
        if REQUIRE_SERVICES:
            pytest.fail(message + " (GATEWAY_REQUIRE_SERVICES=1)")
        pytest.skip(message)
