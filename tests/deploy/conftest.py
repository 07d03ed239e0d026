"""The deploy tier: the container image of deploy/Dockerfile, built once per session."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.containers import (
    IMAGE,
    Container,
    build_image,
    ensure_base_image,
    require_podman,
)

# Test processes running side by side (pytest-xdist) take turns: the first makes the base and
# builds, the others then find the base and every layer cached.
BUILD_LOCK = Path("/var/tmp/agents-ws-gateway-image.lock")


@pytest.fixture(scope="session")
def image() -> str:
    """The image, built from the working tree on the local Debian base."""
    require_podman()
    with BUILD_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ensure_base_image()
        build_image()
    return IMAGE


@pytest.fixture
def containers() -> Iterator[list[Container]]:
    """Containers a test starts; removed (with their volumes) when it ends."""
    started: list[Container] = []
    yield started
    for container in started:
        container.remove()
