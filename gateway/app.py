"""create_app(settings) -> Starlette. Composition only: routes, lifespan, resources."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
from collections.abc import AsyncIterator, Callable, Iterable
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from agents import set_tracing_disabled
from agents.models import get_default_model
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Route, WebSocketRoute

from gateway.abuse.limits import Limits
from gateway.abuse.shared_usage import SharedUsage
from gateway.agents import identity_shortcut
from gateway.agents.demo.assistant import demo_graph
from gateway.agents.model_providers import (
    OFFLINE,
    build_model_provider,
    default_model_name,
    model_of,
)
from gateway.agents.registry import AgentGraph, AgentRegistry, agent_names, load_registry
from gateway.auth.access import TokenVerifier
from gateway.auth.audit_trail import AuditTrail
from gateway.auth.jwks import KeySource, RemoteKeys, StaticKeys
from gateway.event_log.bus import EventBus
from gateway.event_log.log_watch import LogWatch
from gateway.event_log.relay import open_relay
from gateway.event_log.webhook_dispatch import WebhookConfig, WebhookDispatcher
from gateway.event_log.writer import EventLog
from gateway.frontends.ag_ui.http import routes as ag_ui_routes
from gateway.frontends.ai_sdk import routes as ai_sdk_routes
from gateway.observability.metrics import MULTIPROC_ENV, GatewayMetrics
from gateway.observability.metrics_endpoint import metrics_route
from gateway.observability.tracing import Telemetry
from gateway.protocol.close_codes import CloseCode
from gateway.resources import Services
from gateway.run_lifecycle.execution import SegmentRunner
from gateway.run_lifecycle.manager import RunManager
from gateway.server.lifespan import StartupRefused
from gateway.server.metrics_listener import MetricsServer
from gateway.settings import Settings
from gateway.specs.serve import routes as spec_routes
from gateway.storage.health import (
    DamagedDatabase,
    ReportingStore,
    StorageHealth,
    integrity_problems,
    refuse_damaged,
)
from gateway.storage.instance_claim import claimed_instance
from gateway.storage.retention_sweeps import Retention
from gateway.transport.http_api import routes as http_routes
from gateway.transport.http_runs import regenerate, retry, send_input, start_run
from gateway.transport.http_threads import routes as thread_routes
from gateway.transport.origin import OriginGate
from gateway.transport.socket_routes import SocketsFirst
from gateway.transport.sse import inbox_stream, thread_stream
from gateway.transport.static_files import demo_app, demo_fallback
from gateway.transport.thread_list_feed import routes as thread_feed_routes
from gateway.transport.ws_endpoint import GatewaySocket
from persistence.backends import open_store
from persistence.instances import InstanceInUse
from persistence.schema import migrate, require_current
from persistence.store import DatabaseConfigError, Store
from persistence.threads import ThreadRepository
from persistence.webhooks import WebhookPlan

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger("gateway")

# Start-up failures an operator fixes in the configuration: one error line, no traceback
# (gateway/server/lifespan.py).
REFUSALS = (DatabaseConfigError, DamagedDatabase, InstanceInUse)

STATIC_DIR = Path(__file__).resolve().parent.parent / "client_demo" / "static"
# The JavaScript client package's modules, which the demo page is built on: served to it
# under /js/gateway-client/ as they are in the package (no build step).
CLIENT_DIR = Path(__file__).resolve().parent.parent / "client_demo" / "js" / "src"
CLIENT_PATH = "/js/gateway-client"
# The useChat example app (client_demo/examples/ai-sdk), as `python3 dev.py` builds it: served
# at /examples/ai-sdk/ once built; without Node.js there is no build and no example.
AI_SDK_EXAMPLE_DIR = (
    Path(__file__).resolve().parent.parent / "client_demo" / "examples" / "ai-sdk" / "dist"
)
AI_SDK_EXAMPLE_PATH = "/examples/ai-sdk"


def server_version() -> str:
    try:
        return version("agents-ws-gateway")
    except PackageNotFoundError:
        return "0.0.0+local"


def build_registry(settings: Settings, model_name: str) -> AgentRegistry:
    if settings.agents:
        return load_registry(settings.agents, model_name=model_name)
    return AgentRegistry([demo_graph(model_name)], default="assistant")


def log_models(
    graphs: AgentRegistry,
    settings: Settings,
    model_name: str,
    starting_agent: Callable[[AgentGraph], Any],
) -> None:
    """One line per graph: which model its starting agent really runs on, and through what."""
    if model_name == OFFLINE:
        through = "the offline demo model (every agent whose model is a name or unset)"
    else:
        where = settings.openai_base_url or "api.openai.com"
        through = f"the SDK's multi-provider (OpenAI {settings.openai_api} at {where})"
    for name in graphs.names():
        graph = graphs.get(name)
        model = model_of(starting_agent(graph), get_default_model())
        log.info(
            "agent graph %r version %s: model %s, through %s", name, graph.version, model, through
        )


def build_verifier(
    settings: Settings, custom_roles: Iterable[str] = (), kept_claims: Iterable[str] = ()
) -> TokenVerifier:
    """HS256 with GATEWAY_SECRET (a random one in development mode), plus RS256/ES256 with
    the JWKS when one is configured. With only a JWKS, HS256 is not accepted at all.
    `custom_roles`: the roles agent graphs require for their tools, accepted in tokens."""
    keys: KeySource | None = None
    if settings.jwks_file is not None:
        keys = StaticKeys.from_file(settings.jwks_file)
    elif settings.jwks_url is not None:
        keys = RemoteKeys(
            settings.jwks_url, cache_s=settings.jwks_cache_s, refetch_s=settings.jwks_refetch_s
        )
    secret: str | None = None
    if settings.secret is not None:
        secret = settings.secret.get_secret_value()
    elif settings.dev_mode:
        log.warning(
            "GATEWAY_SECRET is unset: development tokens are enabled at POST /v1/dev/token "
            "and the gateway only listens on loopback. Set GATEWAY_SECRET in production."
        )
        # Shared by the worker processes of `serve --workers`, else this process's own.
        secret = (
            settings.dev_secret.get_secret_value()
            if settings.dev_secret is not None
            else secrets.token_urlsafe(48)
        )
    return TokenVerifier(
        secret,
        keys=keys,
        leeway_s=settings.jwt_leeway_s,
        issuer=settings.jwt_issuer,
        audience=settings.jwt_audience,
        custom_roles=custom_roles,
        claims=settings.claim_mapping(),
        kept_claims=kept_claims,
    )


def build_webhooks(
    store: Store, settings: Settings, instance_id: str, metrics: GatewayMetrics | None
) -> WebhookDispatcher | None:
    """The webhook dispatcher, when endpoints are configured (docs/protocol.md §10)."""
    if not settings.webhook_url or settings.webhook_secret is None:
        return None
    config = WebhookConfig(
        plan=WebhookPlan(tuple(settings.webhook_url), frozenset(settings.webhook_events)),
        secret=settings.webhook_secret.get_secret_value(),
        timeout_s=settings.webhook_timeout_s,
        max_attempts=settings.webhook_max_attempts,
        max_age_s=settings.webhook_max_age_s,
        backoff_s=settings.webhook_backoff_s,
        max_backoff_s=settings.webhook_max_backoff_s,
        poll_s=settings.webhook_poll_s,
        allow_link_local=settings.webhook_allow_link_local,
    )
    return WebhookDispatcher(store, config, instance_id=instance_id, metrics=metrics)


def close_connections(services: Services) -> None:
    for connection in list(services.connections):
        connection.close_soon(CloseCode.RESTART)


# Query parameters that carry a secret: redis-py and asyncpg also take a `password` there.
SECRET_QUERY_KEY = re.compile(r"pass|secret|token", re.IGNORECASE)


def redacted_url(url: str) -> str:
    """`url` for a log line: its password (and a user name's secret part) left out, in its
    user part or its query."""
    try:
        shown = make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        parts = urlsplit(url)
        shown = url
        if parts.password is not None:
            netloc = f"{parts.username or ''}:***@{parts.hostname or ''}"
            if parts.port is not None:
                netloc += f":{parts.port}"
            shown = urlunsplit(parts._replace(netloc=netloc))
    parts = urlsplit(shown)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    if not any(SECRET_QUERY_KEY.search(key) for key, _ in pairs):
        return shown
    hidden = [(key, "***" if SECRET_QUERY_KEY.search(key) else value) for key, value in pairs]
    return urlunsplit(parts._replace(query=urlencode(hidden, safe="*")))


def cors(settings: Settings) -> list[Middleware]:
    """CORS for the allowed origins, so an app served elsewhere (a dev server, its own domain)
    can call the HTTP API and read the SSE feeds too, not only open the WebSocket. Tokens go in
    the `Authorization` header, never in cookies: credentials stay off."""
    origins = settings.browser_origins()
    if not origins:
        return []
    return [
        Middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "last-event-id"],
            expose_headers=["retry-after"],
            max_age=600,
        )
    ]


def create_app(
    settings: Settings,
    *,
    registry: AgentRegistry | None = None,
    tracer_provider: TracerProvider | None = None,
) -> Starlette:
    """The gateway as an ASGI application. `registry`: the agent graphs (default: the one
    `GATEWAY_AGENTS` names, or the demo); `tracer_provider`: an OpenTelemetry provider of the
    host application's to record the gateway's spans with (default: one exporting over OTLP
    when `GATEWAY_OTEL` is on, else none)."""

    @contextlib.asynccontextmanager
    async def lifespan(_host: Starlette) -> AsyncIterator[None]:
        # Each resource's close is pushed onto the stack before the resource starts (every
        # close is safe on a resource that never started): a start-up that fails at any step
        # closes what it had started, in reverse order, and one close that fails does not
        # skip the others. Shutdown is the same unwinding.
        async with contextlib.AsyncExitStack() as stack:
            try:
                await start(stack)
            except REFUSALS as exc:
                raise StartupRefused(str(exc)) from exc
            yield

    async def start(stack: contextlib.AsyncExitStack) -> None:
        # Traces would leave the machine (the SDK exports to OpenAI by default): off unless
        # asked for. Runs also pass `tracing_disabled` in their RunConfig.
        set_tracing_disabled(not settings.tracing)
        telemetry = Telemetry.from_settings(settings.otel, tracer_provider)
        stack.push_async_callback(telemetry.close)
        backend = open_store(settings.database_url)
        stack.push_async_callback(backend.close)
        health = StorageHealth(backend, probe_every_s=settings.storage_probe_s)
        stack.push_async_callback(health.close)
        problems = await integrity_problems(backend)
        if problems:
            if not settings.allow_damaged_database:
                raise refuse_damaged(problems)
            health.damaged(problems)
        store = ReportingStore(backend, health)
        if settings.migrate:
            await migrate(store)
        else:
            await require_current(store)
        # A database that cannot be written (a read-only file) shows at once, not at the
        # first client's request.
        await health.check()
        instance_id = settings.resolved_instance_id()
        # Before anything can take a run over: a second live process under this instance id
        # is refused here (persistence/instances.py).
        incarnation = await stack.enter_async_context(claimed_instance(store, instance_id))
        # Before anything can authenticate a request: refusals are recorded from the start.
        audit = AuditTrail(store)
        stack.push_async_callback(audit.close)
        audit.start()
        # Only when served: off, nothing is counted (docs/benchmarks.md "Cost of metrics").
        metrics = (
            GatewayMetrics(multiprocess_dir=os.environ.get(MULTIPROC_ENV) or None)
            if settings.metrics
            else None
        )
        bus = EventBus(
            open_relay(
                settings.bus_url,
                prefix=settings.bus_prefix,
                instance_id=instance_id,
                metrics=metrics,
            )
        )
        stack.push_async_callback(bus.close)
        await bus.start()
        webhooks = build_webhooks(store, settings, instance_id, metrics)
        if webhooks is not None:
            # Closed after the event log, which announces events to it.
            stack.push_async_callback(webhooks.close)
        event_log = EventLog(
            store,
            bus,
            metrics=metrics,
            telemetry=telemetry,
            announcements=webhooks,
            merge_s=settings.delta_merge_ms / 1000,
        )
        stack.push_async_callback(event_log.close)
        await event_log.start()
        if webhooks is not None:
            # Deliveries a previous process left are sent at once, before any new ones.
            webhooks.start()
        log_watch = LogWatch(ThreadRepository(store), bus, settings.log_watch_interval_s)
        stack.push_async_callback(log_watch.close)
        log_watch.start()
        retention = Retention(
            store, retention_s=settings.retention_s, sweep_s=settings.retention_sweep_s
        )
        stack.push_async_callback(retention.close)
        retention.start()
        model_name = default_model_name(
            settings.openai_api_key.get_secret_value() if settings.openai_api_key else None,
            settings.model,
        )
        graphs = registry or build_registry(settings, model_name)
        # Every checkpoint's serialisation and restore ranks the graph's agents; for agents
        # whose name is their own the SDK's ranking costs 0.6 ms and decides nothing.
        identity_shortcut.install()
        provider = build_model_provider(
            model=model_name,
            delay_ms=settings.demo_delay_ms,
            openai_api_key=(
                settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
            ),
            openai_base_url=settings.openai_base_url,
            openai_api=settings.openai_api,
        )
        stack.push_async_callback(provider.aclose)
        verifier = build_verifier(
            settings,
            custom_roles=graphs.reviewer_role_names(),
            kept_claims=graphs.context_claim_paths(),
        )
        stack.push_async_callback(verifier.aclose)
        runs = RunManager(
            store=store,
            log=event_log,
            bus=bus,
            registry=graphs,
            segments_factory=partial(
                SegmentRunner,
                store=store,
                log=event_log,
                provider=provider,
                tracing=settings.tracing,
                telemetry=telemetry,
                lease_ttl_s=settings.lease_ttl_s,
                approval_ttl_s=settings.approval_ttl_s,
                metrics=metrics,
            ),
            self_approval=settings.self_approval,
            suspend_grace_s=settings.suspend_grace_s,
            instance_id=instance_id,
            incarnation=incarnation.token,
            lease_ttl_s=settings.lease_ttl_s,
            lease_scan_s=settings.lease_scan_s,
            four_eyes=settings.four_eyes,
            approval_ttl_s=settings.approval_ttl_s,
            approval_sweep_s=settings.approval_sweep_s,
            metrics=metrics,
        )
        stack.push_async_callback(runs.close)
        log_models(graphs, settings, model_name, runs.starting_agent)
        limits = Limits.from_settings(settings)
        # The per-user limits across processes, when a shared bus joins them.
        usage = SharedUsage(bus, limits)
        stack.push_async_callback(usage.close)
        usage.start()
        services = Services(
            settings=settings,
            store=store,
            bus=bus,
            log=event_log,
            registry=graphs,
            runs=runs,
            verifier=verifier,
            limits=limits,
            audit=audit,
            storage=health,
            server_name="agents-ws-gateway",
            server_version=server_version(),
            metrics=metrics,
            telemetry=telemetry,
        )
        # The sockets close (`CloseCode.RESTART`) before the runs stop.
        stack.callback(close_connections, services)
        if metrics is not None:
            # Graph names (runs) and every agent a graph can hand off to (model calls).
            metrics.know_agents(
                {
                    *graphs.names(),
                    *(
                        name
                        for graph in graphs.names()
                        for name in agent_names(runs.starting_agent(graphs.get(graph)))
                    ),
                }
            )
            metrics.count_pending(runs.approvals.count_pending)
            limits.on_refused = metrics.refused
        # On the gateway's own application, not the one running the lifespan: an application
        # that mounts the gateway runs its lifespan (docs/examples/mounted_gateway.py), and
        # requests under the mount see the gateway's state.
        app.state.services = services
        # GATEWAY_METRICS_PORT: the scrape on a listener of its own, not the clients' port.
        if metrics is not None and settings.metrics_port is not None:
            metrics_server = MetricsServer(services, settings.metrics_host, settings.metrics_port)
            stack.push_async_callback(metrics_server.close)
            await metrics_server.start()
        # Runs a previous process left active, then runs of peers whose leases expire.
        runs.recovery.start()
        # Approvals left undecided past GATEWAY_APPROVAL_TTL_S (nothing when it is 0).
        runs.decisions.start_expiry()
        log.info(
            "gateway ready: instance %s, database %s, bus %s, model %s, agents %s",
            instance_id,
            redacted_url(settings.database_url),
            redacted_url(settings.bus_url),
            model_name,
            ", ".join(graphs.names()),
        )

    # One gate for every WebSocket endpoint: one rule, and each refused origin logged once.
    origins = OriginGate()
    app_routes = [
        *thread_feed_routes(),
        *thread_routes(),
        *http_routes(),
        Route("/v1/threads/{thread_id}/stream", thread_stream, methods=["GET"]),
        Route("/v1/approvals/stream", inbox_stream, methods=["GET"]),
        Route("/v1/runs", start_run, methods=["POST"]),
        Route("/v1/threads/{thread_id}/input", send_input, methods=["POST"]),
        Route("/v1/threads/{thread_id}/regenerate", regenerate, methods=["POST"]),
        Route("/v1/runs/{run_id}/retry", retry, methods=["POST"]),
        *ag_ui_routes(),
        *spec_routes(),
        WebSocketRoute("/v1/ws", GatewaySocket(origins), name="websocket"),
        *ai_sdk_routes(origins),
    ]
    if settings.metrics and settings.metrics_port is None:
        app_routes.append(metrics_route())
    app = SocketsFirst(routes=app_routes, lifespan=lifespan, middleware=cors(settings))
    if settings.demo_ui and STATIC_DIR.is_dir():
        # The demo gets only requests no route claims. Mounted at "/", it also took API paths
        # called with a method they lack, answering with its own 404 or a 405 with the wrong
        # `Allow`, where the route answers 405 with the methods it has.
        packages = {CLIENT_PATH: CLIENT_DIR} if CLIENT_DIR.is_dir() else {}
        pages = {AI_SDK_EXAMPLE_PATH: AI_SDK_EXAMPLE_DIR} if AI_SDK_EXAMPLE_DIR.is_dir() else {}
        demo = demo_app(STATIC_DIR, packages=packages, pages=pages)
        app.router.default = demo_fallback(demo, app.router.default)
    return app
