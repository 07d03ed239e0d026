"""A start-up that fails at any step leaves nothing running.

The lifespan (gateway/app.py) is built on an AsyncExitStack: each step's resource is closed
when a later step fails. Here a failure is injected right after each step in turn (the step's
own work done, so its resource exists), and after each failed start-up the process is back to
where it was: no task left, no thread, no open file or socket, the metrics port free, no
database connection (PostgreSQL's own count), and the instance id not left claimed. A full
start-up and shutdown is held to the same.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

import gateway.app as app_module
from gateway.abuse.shared_usage import SharedUsage
from gateway.app import create_app
from gateway.auth.audit_trail import AuditTrail
from gateway.event_log.bus import EventBus
from gateway.event_log.log_watch import LogWatch
from gateway.event_log.webhook_dispatch import WebhookDispatcher
from gateway.event_log.writer import EventLog
from gateway.run_lifecycle.decisions import Decisions
from gateway.run_lifecycle.recovery import Recovery
from gateway.server.metrics_listener import MetricsServer
from gateway.storage.health import StorageHealth
from gateway.storage.retention_sweeps import Retention
from persistence.backends import open_store
from persistence.instances import InstanceClaims
from tests.support.gateway import test_settings as settings_for

pytestmark = pytest.mark.both_backends

# Every step of the lifespan, as (owner, attribute): patched to do its work, then fail.
STEPS: list[tuple[Any, str]] = [
    (app_module, "integrity_problems"),
    (app_module, "migrate"),
    (StorageHealth, "check"),
    (InstanceClaims, "claim"),
    (AuditTrail, "start"),
    (EventBus, "start"),
    (EventLog, "start"),
    (WebhookDispatcher, "start"),
    (LogWatch, "start"),
    (Retention, "start"),
    (app_module, "build_model_provider"),
    (app_module, "build_verifier"),
    (app_module, "log_models"),
    (SharedUsage, "start"),
    (MetricsServer, "start"),
    (Recovery, "start"),
    (Decisions, "start_expiry"),
]


class Injected(RuntimeError):
    pass


def failing_after(original: Callable[..., Any], name: str) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def async_step(*args: Any, **kwargs: Any) -> Any:
            await original(*args, **kwargs)
            raise Injected(name)

        return async_step

    @functools.wraps(original)
    def step(*args: Any, **kwargs: Any) -> Any:
        original(*args, **kwargs)
        raise Injected(name)

    return step


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def open_descriptors() -> set[str]:
    found: set[str] = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue  # the listing's own descriptor, closed meanwhile
    return found


async def postgres_connections(database_url: str) -> int:
    if not database_url.startswith("postgresql"):
        return 0
    import asyncpg

    url = make_url(database_url)
    conn = await asyncpg.connect(
        url.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    )
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", url.database
            )
        )
    finally:
        await conn.close()


async def settled(baseline_threads: int) -> None:
    """Give executor threads and cancelled tasks their moment to go."""
    deadline = asyncio.get_running_loop().time() + 5
    while asyncio.get_running_loop().time() < deadline:
        if threading.active_count() <= baseline_threads and not others():
            return
        await asyncio.sleep(0.05)


def others() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


async def test_a_failure_at_any_start_up_step_leaves_nothing_running(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics_port = free_port()
    settings = settings_for(
        database_url,
        instance_id="gw-start-up",
        metrics=True,
        metrics_port=metrics_port,
        webhook_url=["http://127.0.0.1:9/hook"],
        webhook_secret="whsec_" + "x" * 32,
        # Each background loop runs (approval expiry sweeps only with a TTL).
        approval_ttl_s=60,
        retention_s=3600,
    )
    # The schema exists first: the migration step's own engine is not what is looked for.
    store = open_store(database_url)
    await app_module.migrate(store)
    await store.close()
    baseline_threads = threading.active_count()
    baseline_files = open_descriptors()
    baseline_connections = await postgres_connections(database_url)

    async def assert_nothing_left(after: str) -> None:
        await settled(baseline_threads)
        assert not others(), f"tasks left after {after}: {others()}"
        assert threading.active_count() <= baseline_threads, f"threads left after {after}"
        assert open_descriptors() <= baseline_files, (
            f"files or sockets left open after {after}: {open_descriptors() - baseline_files}"
        )
        with socket.socket() as probe:  # the metrics listener's port is free again
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((settings.metrics_host, metrics_port))
        assert await postgres_connections(database_url) <= baseline_connections, after
        check = open_store(database_url)
        try:
            assert await InstanceClaims(check).current("gw-start-up") is None, after
        finally:
            await check.close()

    for owner, name in STEPS:
        with monkeypatch.context() as patch:
            patch.setattr(owner, name, failing_after(getattr(owner, name), name))
            app = create_app(settings)
            with pytest.raises(Injected, match=name):
                async with app.router.lifespan_context(app):
                    pass
        await assert_nothing_left(f"a failure at {name}")

    app = create_app(settings)
    async with app.router.lifespan_context(app):
        assert app.state.services.runs is not None
    await assert_nothing_left("a shutdown")
