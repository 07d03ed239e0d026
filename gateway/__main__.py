"""`python -m gateway serve` (its flags built from the settings, gateway/settings_cli.py),
`python -m gateway migrate`, and the operator's commands on the database: `runs`, `approvals`,
`threads` (gateway/operator/)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import logging.config
import sys

from gateway.server.gc_policy import SurvivorFreezing
from gateway.settings import Settings, SettingsError, load_settings
from gateway.settings_cli import add_setting_flag, add_settings_flags, overrides


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m gateway")
    commands = root.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the gateway",
        usage="%(prog)s [-h] [flags]",
        description="Run the gateway. Each flag sets the GATEWAY_* variable it names and wins "
        "over it; docs/configuration.md describes every setting in full.",
    )
    add_settings_flags(serve)
    migrate = commands.add_parser(
        "migrate", help="create or upgrade the database schema (or show it, or take it back)"
    )
    add_setting_flag(migrate, "database_url")
    chosen = migrate.add_mutually_exclusive_group()
    chosen.add_argument(
        "--current",
        action="store_true",
        help="print the schema's revision and the newest one (exit status 1 when behind)",
    )
    chosen.add_argument(
        "--downgrade", metavar="REVISION", default=None, help="take the schema back to REVISION"
    )
    from gateway.operator.commands import add_commands

    add_commands(commands)
    return root


def settings_from(args: argparse.Namespace) -> Settings:
    return load_settings(**overrides(args))


def serve(settings: Settings, argv: list[str]) -> None:
    """Serve; `argv`: the command's flags (a supervisor hands them on to its workers)."""

    from gateway.app import create_app
    from gateway.observability.log_config import logging_config
    from gateway.server.config import GatewayServer, gateway_config, listening_socket

    log_config = logging_config(settings.log_level, settings.log_format)
    logging.config.dictConfig(log_config)
    if settings.workers > 1 and settings.listen_fd is None:
        from gateway.server.config import refuse_port
        from gateway.server.workers import Supervisor

        # Once, before the workers start: they would otherwise race to create the schema.
        # With migrations off, the workers would each refuse a schema not at this revision:
        # refused here once instead, as a single process would.
        if settings.migrate:
            migrate(settings, serving=True)
        else:
            require_schema(settings)
        try:
            supervisor = Supervisor(settings, argv)  # binds the port
        except OSError as exc:
            refuse_port(settings, exc)
        sys.exit(supervisor.run())
    # Before anything else: a port in use stops a second copy before its start-up begins.
    listener = listening_socket(settings) if settings.listen_fd is None else None
    app = create_app(settings)
    # Everything imported so far (the SDK, the OpenAI types, pydantic's schemas: most of the
    # heap) lives as long as the process. Frozen, a full collection no longer walks it: with the
    # SDK loaded one took ~200 ms, stalling every run and socket, ~25 ms once frozen.
    gc.collect()
    gc.freeze()
    if settings.gc_thaw_s > 0:
        # From here on, what survives each full collection is frozen too
        # (gateway/server/gc_policy.py).
        SurvivorFreezing(settings.gc_thaw_s).install()
    if settings.supervisor_pid is not None:
        from gateway.server.workers import stop_with_supervisor

        stop_with_supervisor(settings.supervisor_pid)
    # A worker of `serve --workers` accepts on the socket its supervisor bound for it, and
    # tells it once it serves.
    where = {"fd": settings.listen_fd} if settings.listen_fd is not None else {}
    config = gateway_config(
        app, settings, log_level=settings.log_level, log_config=log_config, **where
    )
    if listener is not None:
        GatewayServer(config).run(sockets=[listener])
        return
    from gateway.server.workers import WorkerServer

    WorkerServer(config, settings.ready_fd).run()


def migrate(
    settings: Settings,
    *,
    current: bool = False,
    downgrade: str | None = None,
    serving: bool = False,
) -> int:
    """Upgrade to the newest revision; or print the revision (`current`: exit status 1 when
    the schema is behind, so a deployment script can tell); or take it back. Each says what
    it found and what it did."""
    from persistence import schema
    from persistence.backends import open_store

    backend = settings.database_url.split("://")[0]

    async def main() -> tuple[str, int]:
        store = open_store(settings.database_url)
        try:
            found = await schema.revision(store)
            if current:
                if found.up_to_date:
                    return f"revision {found.current}, newest {found.head}: up to date", 0
                return (
                    f"revision {found.current or '(none)'}, newest {found.head}: behind "
                    "(`python -m gateway migrate` upgrades it)",
                    1,
                )
            if downgrade is not None:
                await schema.downgrade(store, downgrade)
                return f"schema taken back to {(await schema.revision(store)).current}", 0
            await schema.migrate(store)
            if found.current is None:
                return f"schema created at revision {found.head}", 0
            if found.up_to_date:
                return f"schema already at the newest revision, {found.head}: nothing to do", 0
            return f"schema upgraded from revision {found.current} to {found.head}", 0
        finally:
            await store.close()

    said, status = asyncio.run(main())
    if serving:
        # The supervisor of `serve --workers`: a log line like every other it writes (JSON
        # under GATEWAY_LOG_FORMAT=json), not a bare print.
        logging.getLogger("gateway").info("%s (%s)", said, backend)
    else:
        print(f"{said} ({backend})")
    return status


def require_schema(settings: Settings) -> None:
    """Exit with one error line unless the schema is at this gateway's revision (GATEWAY_MIGRATE
    off: nothing is migrated)."""
    from gateway.server.config import STARTUP_FAILURE
    from persistence import schema
    from persistence.backends import open_store

    async def check() -> None:
        store = open_store(settings.database_url)
        try:
            await schema.require_current(store)
        finally:
            await store.close()

    try:
        asyncio.run(check())
    except schema.SchemaBehind as exc:
        logging.getLogger("gateway").error("not starting: %s", exc)
        raise SystemExit(STARTUP_FAILURE) from None


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
        return migrate(settings, current=args.current, downgrade=args.downgrade)
    else:
        from gateway.operator import commands

        return commands.run(args, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
