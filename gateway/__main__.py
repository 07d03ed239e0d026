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
        "--current", action="store_true", help="print the schema's revision and the newest one"
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
    import uvicorn

    from gateway.app import create_app
    from gateway.observability.log_config import logging_config
    from gateway.server.config import gateway_config

    log_config = logging_config(settings.log_level, settings.log_format)
    logging.config.dictConfig(log_config)
    if settings.workers > 1 and settings.listen_fd is None:
        from gateway.server.workers import Supervisor

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
        from gateway.server.workers import stop_with_supervisor

        stop_with_supervisor(settings.supervisor_pid)
    # A worker of `serve --workers` accepts on the socket its supervisor bound for it, and
    # tells it once it serves.
    where = {"fd": settings.listen_fd} if settings.listen_fd is not None else {}
    config = gateway_config(
        app, settings, log_level=settings.log_level, log_config=log_config, **where
    )
    if settings.listen_fd is None:
        uvicorn.Server(config).run()
        return
    from gateway.server.workers import WorkerServer

    WorkerServer(config, settings.ready_fd).run()


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
