"""Shared fixtures, and each test's tier. Tests needing an external service use
`require_service`."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import seeds

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


BACKENDS = ("sqlite", "postgresql")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "both_backends: run the test on SQLite and on PostgreSQL (the `database_url` fixture)",
    )
    # Before the workers start (they inherit the environment), so they share one seed.
    seeds.draw_if_random()


def pytest_report_header(config: pytest.Config) -> str:
    return f"randomized tests: {seeds.replay_hint()}"


# Each test's tiers (markers registered in pyproject.toml), from its folder under tests/ and,
# for the kinds a folder does not say, its file: `pytest -m unit`, `-m "not soak"`. A test
# folder missing here stops the run, so no test goes without a tier.
FOLDER_TIERS: dict[str, tuple[str, ...]] = {
    "unit": ("unit",),
    "contract": ("contract",),
    "integration": ("integration",),
    "crash": ("crash",),
    "browser": ("browser",),
    "hostile": ("hostile",),
    "frontends": ("frontends",),
    "deploy": ("deploy",),
}
FILE_TIERS: dict[str, tuple[str, ...]] = {
    "crash/test_soak.py": ("soak",),
    "unit/test_frame_fuzz.py": ("fuzz",),
    "integration/test_live_fuzz.py": ("fuzz",),
    "integration/test_openapi_schemathesis.py": ("fuzz",),
    # Node.js without tests/support/node_scripts: the JavaScript client's own test runner, and
    # the useChat example app the browser drives.
    "integration/test_js_client.py": ("js",),
    "browser/test_ai_sdk_example.py": ("js",),
}
# A module using one of these helpers gets the marker: Node.js scripts, the machine's
# PostgreSQL (besides the PostgreSQL half of `both_backends`) and its Redis.
SERVICE_MODULES = {
    "tests.support.node_scripts": "js",
    "tests.support.postgres": "postgres",
    "tests.support.redis": "redis",
}
TESTS = Path(__file__).resolve().parent


def uses(module: ModuleType | None, helpers: str, seen: set[str] | None = None) -> bool:
    """Whether the test module imported something from the `helpers` module, itself or
    through another test module it imports from (the frontends' tests reuse integration
    tests' helpers)."""
    if module is None:
        return False
    seen = seen if seen is not None else {module.__name__}
    for value in vars(module).values():
        origin = getattr(value, "__module__", None)
        if not isinstance(origin, str):
            continue
        if origin == helpers:
            return True
        if origin.rpartition(".")[2].startswith("test_") and origin not in seen:
            seen.add(origin)
            if uses(sys.modules.get(origin), helpers, seen):
                return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        relative = item.path.resolve().relative_to(TESTS)
        folder = relative.parts[0]
        if folder not in FOLDER_TIERS:
            raise pytest.UsageError(f"tests/{folder}/ has no tier: add it to FOLDER_TIERS")
        tiers = [*FOLDER_TIERS[folder], *FILE_TIERS.get(relative.as_posix(), ())]
        module = getattr(item, "module", None)
        tiers += [marker for helpers, marker in SERVICE_MODULES.items() if uses(module, helpers)]
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("database_url") == "postgresql":
            tiers.append("postgres")
        for tier in dict.fromkeys(tiers):
            item.add_marker(tier)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests marked `both_backends` that use `database_url` run once per backend; others get
    the SQLite file."""
    if "database_url" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "both_backends"
    ):
        metafunc.parametrize("database_url", BACKENDS, indirect=True)


@pytest.fixture
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """The test's own database: a SQLite file in its folder, or a PostgreSQL database created
    for it and dropped afterwards."""
    backend = getattr(request, "param", "sqlite")
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'gateway.db'}"
        return
    from tests.support.postgres import postgres_database

    async with postgres_database() as url:
        yield url


@pytest.fixture(scope="session", autouse=True)
def _fork_server_closed() -> Iterator[None]:
    """This worker's fork server (tests/support/fork_server.py) ends with its session, taking
    any gateway a test left running with it."""
    yield
    from tests.support.fork_server import fork_server

    fork_server().close()
