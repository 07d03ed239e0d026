"""`python -m gateway serve` (flags mirror GATEWAY_* settings), `python -m gateway migrate`, and
the operator's commands on the database: `runs`, `approvals`, `threads` (gateway/operator/)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import logging.config
import sys

from gateway.settings import Settings, SettingsError, load_settings

# Flag -> settings field. GATEWAY_SECRET, GATEWAY_WEBHOOK_SECRET and OPENAI_API_KEY are
# environment-only on purpose: command lines are visible to every user of the machine.
FLAGS: dict[str, tuple[str, type, str]] = {
    "--host": ("host", str, "listen address (GATEWAY_HOST)"),
    "--port": ("port", int, "listen port, 0 for any free port (GATEWAY_PORT)"),
    "--database-url": ("database_url", str, "SQLite or PostgreSQL URL (GATEWAY_DATABASE_URL)"),
    "--bus-url": ("bus_url", str, "memory:// or redis://host:port/db (GATEWAY_BUS_URL)"),
    "--bus-prefix": ("bus_prefix", str, "Redis channel prefix (GATEWAY_BUS_PREFIX)"),
    "--allowed-origins": (
        "allowed_origins",
        str,
        "extra browser origins, comma-separated (GATEWAY_ALLOWED_ORIGINS)",
    ),
    "--jwt-leeway-s": ("jwt_leeway_s", int, "clock skew allowed on exp/nbf (GATEWAY_JWT_LEEWAY_S)"),
    "--jwt-issuer": ("jwt_issuer", str, "required token 'iss' (GATEWAY_JWT_ISSUER)"),
    "--jwt-audience": ("jwt_audience", str, "required token 'aud' (GATEWAY_JWT_AUDIENCE)"),
    "--jwks-file": ("jwks_file", str, "RS256/ES256 public keys, JWKS file (GATEWAY_JWKS_FILE)"),
    "--jwks-url": ("jwks_url", str, "RS256/ES256 public keys, JWKS URL (GATEWAY_JWKS_URL)"),
    "--jwks-cache-s": ("jwks_cache_s", float, "use fetched keys this long (GATEWAY_JWKS_CACHE_S)"),
    "--jwks-refetch-s": (
        "jwks_refetch_s",
        float,
        "least seconds between JWKS fetches (GATEWAY_JWKS_REFETCH_S)",
    ),
    "--metrics-host": (
        "metrics_host",
        str,
        "address of GATEWAY_METRICS_PORT's listener, default 127.0.0.1 (GATEWAY_METRICS_HOST)",
    ),
    "--metrics-port": (
        "metrics_port",
        int,
        "serve /metrics on this port instead of the gateway's (GATEWAY_METRICS_PORT)",
    ),
    "--openai-api": (
        "openai_api",
        str,
        "responses or chat_completions (GATEWAY_OPENAI_API)",
    ),
    "--forwarded-allow-ips": (
        "forwarded_allow_ips",
        str,
        "proxies whose X-Forwarded-* headers are believed (GATEWAY_FORWARDED_ALLOW_IPS)",
    ),
    "--jwt-user-claim": ("jwt_user_claim", str, "user claim path (GATEWAY_JWT_USER_CLAIM)"),
    "--jwt-tenant-claim": (
        "jwt_tenant_claim",
        str,
        "tenant claim path (GATEWAY_JWT_TENANT_CLAIM)",
    ),
    "--jwt-roles-claim": ("jwt_roles_claim", str, "roles claim path (GATEWAY_JWT_ROLES_CLAIM)"),
    "--jwt-tenant": ("jwt_tenant", str, "every caller's tenant (GATEWAY_JWT_TENANT)"),
    "--jwt-role-map": (
        "jwt_role_map",
        str,
        "provider-role=gateway-role,... (GATEWAY_JWT_ROLE_MAP)",
    ),
    "--suspend-grace-s": ("suspend_grace_s", float, "GATEWAY_SUSPEND_GRACE_S"),
    "--approval-ttl-s": (
        "approval_ttl_s",
        float,
        "reject approvals undecided this long, 0 = never (GATEWAY_APPROVAL_TTL_S)",
    ),
    "--approval-sweep-s": (
        "approval_sweep_s",
        float,
        "how often to look for expired approvals (GATEWAY_APPROVAL_SWEEP_S)",
    ),
    "--max-frame-bytes": ("max_frame_bytes", int, "GATEWAY_MAX_FRAME_BYTES"),
    "--demo-delay-ms": ("demo_delay_ms", int, "offline model delay (GATEWAY_DEMO_DELAY_MS)"),
    "--model": ("model", str, "model name, 'offline' for the demo model (GATEWAY_MODEL)"),
    "--agents": ("agents", str, "agent registry 'package.module:attribute' (GATEWAY_AGENTS)"),
    "--heartbeat-s": ("heartbeat_s", float, "GATEWAY_HEARTBEAT_S"),
    "--hello-timeout-s": ("hello_timeout_s", float, "GATEWAY_HELLO_TIMEOUT_S"),
    "--send-queue-size": ("send_queue_size", int, "GATEWAY_SEND_QUEUE_SIZE"),
    "--send-timeout-s": ("send_timeout_s", float, "GATEWAY_SEND_TIMEOUT_S"),
    "--max-input-chars": ("max_input_chars", int, "GATEWAY_MAX_INPUT_CHARS"),
    "--send-queue-bytes": (
        "send_queue_bytes",
        int,
        "outgoing bytes buffered per connection (GATEWAY_SEND_QUEUE_BYTES)",
    ),
    "--idle-timeout-s": (
        "idle_timeout_s",
        float,
        "close a connection silent this long (GATEWAY_IDLE_TIMEOUT_S)",
    ),
    "--header-timeout-s": (
        "header_timeout_s",
        float,
        "a request head must arrive within this (GATEWAY_HEADER_TIMEOUT_S)",
    ),
    "--body-timeout-s": (
        "body_timeout_s",
        float,
        "a request body must arrive within this (GATEWAY_BODY_TIMEOUT_S)",
    ),
    "--max-header-bytes": ("max_header_bytes", int, "GATEWAY_MAX_HEADER_BYTES"),
    "--max-headers": ("max_headers", int, "GATEWAY_MAX_HEADERS"),
    "--max-connections": (
        "max_connections",
        int,
        "open connections per process, 0 = no bound (GATEWAY_MAX_CONNECTIONS)",
    ),
    "--backlog": ("backlog", int, "listen queue length (GATEWAY_BACKLOG)"),
    "--frames-per-s": (
        "frames_per_s",
        float,
        "client frames per second per connection, 0 = off (GATEWAY_FRAMES_PER_S)",
    ),
    "--frame-burst": (
        "frame_burst",
        int,
        "frames a connection may send at once (GATEWAY_FRAME_BURST)",
    ),
    "--runs-per-minute": (
        "runs_per_minute",
        int,
        "runs a user may start per minute, 0 = off (GATEWAY_RUNS_PER_MINUTE)",
    ),
    "--max-connections-per-user": (
        "max_connections_per_user",
        int,
        "open connections per user, 0 = off (GATEWAY_MAX_CONNECTIONS_PER_USER)",
    ),
    "--max-subscriptions": (
        "max_subscriptions",
        int,
        "thread subscriptions per connection, 0 = off (GATEWAY_MAX_SUBSCRIPTIONS)",
    ),
    "--max-pending-inputs": (
        "max_pending_inputs",
        int,
        "queued or staged inputs per thread, 0 = off (GATEWAY_MAX_PENDING_INPUTS)",
    ),
    "--storage-probe-s": (
        "storage_probe_s",
        float,
        "while storage fails, try a write this often (GATEWAY_STORAGE_PROBE_S)",
    ),
    "--log-level": ("log_level", str, "GATEWAY_LOG_LEVEL"),
    "--log-format": ("log_format", str, "text or json, one object per line (GATEWAY_LOG_FORMAT)"),
    "--retention-s": (
        "retention_s",
        float,
        "keep ended runs' logs this long (GATEWAY_RETENTION_S)",
    ),
    "--retention-sweep-s": ("retention_sweep_s", float, "GATEWAY_RETENTION_SWEEP_S"),
    "--instance-id": ("instance_id", str, "this process's id for run leases (GATEWAY_INSTANCE_ID)"),
    "--lease-ttl-s": ("lease_ttl_s", float, "run lease time-to-live (GATEWAY_LEASE_TTL_S)"),
    "--lease-scan-s": (
        "lease_scan_s",
        float,
        "look for expired run leases this often, default half the TTL (GATEWAY_LEASE_SCAN_S)",
    ),
    "--workers": (
        "workers",
        int,
        "gateway processes sharing the port, kept running (GATEWAY_WORKERS)",
    ),
    "--webhook-url": (
        "webhook_url",
        str,
        "webhook endpoints, comma-separated http(s) URLs (GATEWAY_WEBHOOK_URL)",
    ),
    "--webhook-events": (
        "webhook_events",
        str,
        "webhook event types, comma-separated (GATEWAY_WEBHOOK_EVENTS)",
    ),
    "--webhook-timeout-s": (
        "webhook_timeout_s",
        float,
        "one delivery attempt's time limit (GATEWAY_WEBHOOK_TIMEOUT_S)",
    ),
    "--webhook-max-attempts": (
        "webhook_max_attempts",
        int,
        "attempts before a delivery is given up (GATEWAY_WEBHOOK_MAX_ATTEMPTS)",
    ),
    "--webhook-max-age-s": (
        "webhook_max_age_s",
        float,
        "give a delivery up this long after its event (GATEWAY_WEBHOOK_MAX_AGE_S)",
    ),
    "--webhook-backoff-s": (
        "webhook_backoff_s",
        float,
        "first retry's wait, doubled per retry (GATEWAY_WEBHOOK_BACKOFF_S)",
    ),
    "--webhook-max-backoff-s": (
        "webhook_max_backoff_s",
        float,
        "longest wait between attempts (GATEWAY_WEBHOOK_MAX_BACKOFF_S)",
    ),
    "--webhook-poll-s": (
        "webhook_poll_s",
        float,
        "look for due webhook retries this often (GATEWAY_WEBHOOK_POLL_S)",
    ),
    "--log-watch-interval-s": (
        "log_watch_interval_s",
        float,
        "poll for other processes' events, 0 = off (GATEWAY_LOG_WATCH_INTERVAL_S)",
    ),
}
BOOL_FLAGS: dict[str, tuple[str, str]] = {
    "--self-approval": (
        "self_approval",
        "owners may approve their own calls (GATEWAY_SELF_APPROVAL)",
    ),
    "--four-eyes": (
        "four_eyes",
        "a run's requester may never approve its calls (GATEWAY_FOUR_EYES)",
    ),
    "--tracing": ("tracing", "send SDK traces to the configured exporter (GATEWAY_TRACING)"),
    "--otel": ("otel", "export OpenTelemetry spans over OTLP (GATEWAY_OTEL)"),
    "--metrics": ("metrics", "serve Prometheus metrics at GET /metrics (GATEWAY_METRICS)"),
    "--allow-damaged-database": (
        "allow_damaged_database",
        "start on a SQLite file that fails its integrity check (GATEWAY_ALLOW_DAMAGED_DATABASE)",
    ),
}

# Settings that are on by default, turned off by a flag.
NEGATIVE_FLAGS = {
    "--no-demo": ("demo_ui", "serve the API only, not the browser demo (GATEWAY_DEMO_UI)"),
    "--no-migrate": (
        "migrate",
        "do not migrate the schema at start-up; refuse any other revision (GATEWAY_MIGRATE)",
    ),
}


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m gateway")
    commands = root.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway")
    for flag, (field, kind, text) in FLAGS.items():
        serve.add_argument(flag, dest=field, type=kind, default=None, help=text)
    for flag, (field, text) in BOOL_FLAGS.items():
        serve.add_argument(flag, dest=field, action="store_true", default=None, help=text)
    for flag, (field, text) in NEGATIVE_FLAGS.items():
        serve.add_argument(flag, dest=field, action="store_false", default=None, help=text)
    migrate = commands.add_parser(
        "migrate", help="create or upgrade the database schema (or show it, or take it back)"
    )
    migrate.add_argument("--database-url", dest="database_url", default=None)
    chosen = migrate.add_mutually_exclusive_group()
    chosen.add_argument(
        "--current", action="store_true", help="print the schema's revision and the newest one"
    )
    chosen.add_argument(
        "--downgrade", metavar="REVISION", default=None, help="take the schema back to REVISION"
    )
    from gateway.operator.commands import add_commands

    add_commands(commands)
    return root


def settings_from(args: argparse.Namespace) -> Settings:
    known = Settings.model_fields
    overrides = {k: v for k, v in vars(args).items() if k in known and v is not None}
    return load_settings(**overrides)


def serve(settings: Settings, argv: list[str]) -> None:
    """Serve; `argv`: the command's flags (a supervisor hands them on to its workers)."""
    import uvicorn

    from gateway.app import create_app
    from gateway.log_config import logging_config
    from gateway.server import gateway_config

    log_config = logging_config(settings.log_level, settings.log_format)
    logging.config.dictConfig(log_config)
    if settings.workers > 1 and settings.listen_fd is None:
        from gateway.workers import Supervisor

        # Once, before the workers start: they would otherwise race to create the schema.
        migrate(settings)
        sys.exit(Supervisor(settings, argv).run())
    app = create_app(settings)
    # Everything imported so far (the SDK, the OpenAI types, pydantic's schemas: most of the
    # heap) lives as long as the process. Frozen, a full collection no longer walks it: with the
    # SDK loaded one took ~200 ms, stalling every run and socket, ~25 ms once frozen.
    gc.collect()
    gc.freeze()
    if settings.supervisor_pid is not None:
        from gateway.workers import stop_with_supervisor

        stop_with_supervisor(settings.supervisor_pid)
    # A worker of `serve --workers` accepts on the socket its supervisor bound.
    where = {"fd": settings.listen_fd} if settings.listen_fd is not None else {}
    config = gateway_config(
        app, settings, log_level=settings.log_level, log_config=log_config, **where
    )
    uvicorn.Server(config).run()


def migrate(settings: Settings, *, current: bool = False, downgrade: str | None = None) -> None:
    """Upgrade to the newest revision; or print the revision (`current`); or take it back."""
    from persistence import schema
    from persistence.store import open_store

    backend = settings.database_url.split("://")[0]

    async def main() -> str:
        store = open_store(settings.database_url)
        try:
            if current:
                found = await schema.revision(store)
                state = "up to date" if found.up_to_date else "behind"
                return f"revision {found.current or '(none)'}, newest {found.head}: {state}"
            if downgrade is not None:
                await schema.downgrade(store, downgrade)
                return f"schema taken back to {(await schema.revision(store)).current}"
            await schema.migrate(store)
            return "schema is up to date"
        finally:
            await store.close()

    print(f"{asyncio.run(main())} ({backend})")


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(raw)
    try:
        settings = settings_from(args)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve":
        serve(settings, raw[1:])
    elif args.command == "migrate":
        migrate(settings, current=args.current, downgrade=args.downgrade)
    else:
        from gateway.operator import commands

        return commands.run(args, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
