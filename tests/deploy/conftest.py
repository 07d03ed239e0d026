"""The deploy tier: the container image of deploy/Dockerfile, built once per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.containers import (
    IMAGE,
    Container,
    build_image,
    ensure_base_image,
    require_podman,
)


@pytest.fixture(scope="session")
def image() -> str:
    """The image, built from the working tree on the local Debian base."""
    require_podman()
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
