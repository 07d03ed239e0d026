"""The operator's sub-commands: `runs list|show|cancel`, `approvals list`, `threads export`.

Each opens the configured database (`GATEWAY_DATABASE_URL` or `--database-url`, resolved as for
`serve` and `migrate`), refuses one that is missing or not at this gateway's schema revision
(it never migrates: an operator looking at a database should not change its schema), does its
work and closes it. A SQLite file is opened read-only (persistence/sqlite/connect.py) to be
checked and by every command that only reads: a file that is refused is left as it was (no
switch to WAL, no empty database made of an empty file), and one the operator may only read can
be read. `runs cancel`, which writes, opens it for writing once it has been checked. Failures
are one line on stderr, `error (<code>): <sentence>`, and an exit status per code
(`EXIT_STATUS`), so scripts can tell a wrong id from a database not ready.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import TextIO

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError

from gateway.event_log.logged_event import encode_page
from gateway.operator import output
from gateway.operator.filters import FilterError, parse_duration, parse_states
from gateway.protocol.error_codes import CodedError, ErrorCode, GatewayError, conflict, not_found
from gateway.protocol.frames import utc_ts
from gateway.settings import Settings
from gateway.settings_cli import add_setting_flag
from persistence import schema
from persistence.approvals import ApprovalRepository
from persistence.backends import open_store
from persistence.clock import utcnow
from persistence.errors import StaleWrite, StorageUnavailable
from persistence.runs import RunRepository
from persistence.store import DatabaseConfigError, Store
from persistence.threads import ThreadRepository

# The database is missing, empty, or at another schema revision than this gateway's.
SCHEMA_NOT_CURRENT = "schema_not_current"
EXIT_STATUS: dict[str, int] = {
    # argparse exits with 2 for what it refuses itself: a bad filter is the same kind of error.
    ErrorCode.BAD_REQUEST: 2,
    ErrorCode.NOT_FOUND: 3,
    ErrorCode.CONFLICT: 4,
    ErrorCode.UNAVAILABLE: 5,
    SCHEMA_NOT_CURRENT: 6,
}


class SchemaNotCurrent(CodedError):
    """The database is not one this gateway can read as it is: the operator's to fix, so it
    has its own exit status (`SCHEMA_NOT_CURRENT`); to a client it would be a fault."""


# Events read per page by `threads export`, as a replay reads them.
EXPORT_PAGE = 500


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the operator's sub-commands to `python -m gateway`'s parser."""
    runs = commands.add_parser("runs", help="list, show or cancel runs (operator)")
    on_runs = runs.add_subparsers(dest="action", required=True)
    listing = _with_database(
        on_runs.add_parser("list", help="runs, the longest in their state first")
    )
    listing.add_argument(
        "--state",
        dest="states",
        action="append",
        default=[],
        metavar="STATE",
        help="running, waiting_for_review, resuming, suspended, recovering, completed, failed, "
        "cancelled, or active (all but the last three); repeat or separate with commas",
    )
    listing.add_argument(
        "--older-than",
        dest="older_than",
        metavar="DURATION",
        help="unchanged (no status change or checkpoint) at least this long: 90s, 10m, 2h",
    )
    listing.add_argument("--tenant", help="runs of this tenant only")
    listing.add_argument("--thread", dest="thread_id", metavar="THREAD_ID")
    _with_limit(listing)
    _with_json(listing)
    show = _with_database(on_runs.add_parser("show", help="one run, its lease and its approvals"))
    show.add_argument("run_id", metavar="RUN_ID")
    _with_json(show)
    cancel = _with_database(
        on_runs.add_parser("cancel", help="cancel a paused, suspended or abandoned run")
    )
    cancel.add_argument("run_id", metavar="RUN_ID")
    cancel.add_argument(
        "--force",
        action="store_true",
        help="also when a gateway process streams the run: revoke its lease (it stops the run "
        "at its next lease renewal)",
    )
    cancel.add_argument(
        "--actor", help="who the audit trail records (default operator:<login name>)"
    )

    approvals = commands.add_parser("approvals", help="list pending approvals (operator)")
    on_approvals = approvals.add_subparsers(dest="action", required=True)
    pending = _with_database(
        on_approvals.add_parser("list", help="pending approvals, the longest waiting first")
    )
    pending.add_argument("--tenant", help="approvals of this tenant only")
    _with_limit(pending)
    _with_json(pending)

    threads = commands.add_parser("threads", help="list threads, export one's log (operator)")
    on_threads = threads.add_subparsers(dest="action", required=True)
    thread_listing = _with_database(
        on_threads.add_parser("list", help="threads, the newest first (deleted ones never)")
    )
    thread_listing.add_argument("--tenant", help="threads of this tenant only")
    thread_listing.add_argument("--owner", help="threads of this user only")
    thread_listing.add_argument(
        "--archived",
        choices=["no", "only", "too"],
        default="no",
        help="archived threads: left out (no, the default), only them, or listed too",
    )
    _with_limit(thread_listing)
    _with_json(thread_listing)
    export = _with_database(
        on_threads.add_parser(
            "export", help="the thread's events as JSON lines, in seq order, as clients get them"
        )
    )
    export.add_argument("thread_id", metavar="THREAD_ID")
    export.add_argument(
        "--after-seq", type=int, default=0, metavar="SEQ", help="only events after this seq"
    )


def _with_database(command: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_setting_flag(command, "database_url")
    return command


def _with_limit(command: argparse.ArgumentParser) -> None:
    command.add_argument("--limit", type=int, default=100, help="at most this many (100)")


def _with_json(command: argparse.ArgumentParser) -> None:
    command.add_argument("--json", dest="as_json", action="store_true", help="print JSON")


def run(args: argparse.Namespace, settings: Settings, out: TextIO = sys.stdout) -> int:
    """Run one operator command; its exit status."""
    handlers: dict[tuple[str, str], Callable[[Store], Awaitable[None]]] = {
        ("runs", "list"): lambda store: list_runs(store, args, out),
        ("runs", "show"): lambda store: show_run(store, args.run_id, args.as_json, out),
        ("runs", "cancel"): lambda store: cancel(store, settings, args, out),
        ("approvals", "list"): lambda store: list_approvals(store, args, out),
        ("threads", "list"): lambda store: list_threads(store, args, out),
        ("threads", "export"): lambda store: export_thread(
            store, args.thread_id, args.after_seq, out
        ),
    }
    handler = handlers[(args.command, args.action)]

    async def main(url: URL) -> None:
        async with opened(url, writes=handler_writes(args)) as store:
            await handler(store)

    try:
        asyncio.run(main(existing(settings.database_url)))
    except SchemaNotCurrent as exc:
        return _fail(SCHEMA_NOT_CURRENT, str(exc))
    except StorageUnavailable as exc:
        # The operator reads what failed, which a client is not told.
        return _fail(ErrorCode.UNAVAILABLE, str(exc))
    except GatewayError as exc:
        if exc.fault:
            raise
        # A refusal; a `FilterError` (bad_request) among them.
        return _fail(exc.code, exc.message)
    except BrokenPipeError:
        # The reader stopped early (`threads export ... | head`): what it read is what it
        # wanted. Python would otherwise report the pipe again when it flushes at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def handler_writes(args: argparse.Namespace) -> bool:
    return (args.command, args.action) == ("runs", "cancel")


def _fail(code: str, message: str) -> int:
    """The one line of a failure, on stderr; its exit status."""
    print(f"error ({code}): {' '.join(message.split())}", file=sys.stderr)
    return EXIT_STATUS.get(code, 1)


def database_words(exc: BaseException) -> str:
    """What the database said, in one line: a SQLAlchemy error without its statement and the
    link it appends on a second line."""
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    first = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {first[0] if first else ''}".rstrip(": ")


def read_only(parsed: URL) -> URL:
    """The URL that opens `parsed` without writing to it: SQLite's `mode=ro`. (Other backends
    write nothing by being read.)"""
    if parsed.get_backend_name() != "sqlite":
        return parsed
    return parsed.update_query_dict({"mode": "ro"})


def existing(url: str) -> URL:
    """The parsed database URL; for SQLite, only if the file is there: opening it would create
    an empty file where the operator mistyped a path."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file():
        raise SchemaNotCurrent(
            f"no database file at {parsed.database or '(memory)'}: check --database-url or "
            "GATEWAY_DATABASE_URL",
        )
    return parsed


@asynccontextmanager
async def opened(parsed: URL, *, writes: bool = False) -> AsyncIterator[Store]:
    """The store on `parsed`, once it is known to hold this gateway's schema; opened read-only
    unless the command `writes`, and checked read-only in any case."""
    try:
        store = open_store(read_only(parsed))
    except DatabaseConfigError as exc:
        raise GatewayError(ErrorCode.BAD_REQUEST, str(exc)) from exc
    try:
        try:
            found = await schema.revision(store)
        except Exception as exc:
            raise GatewayError(
                ErrorCode.UNAVAILABLE, f"cannot read the database: {database_words(exc)}"
            ) from exc
        if not found.up_to_date:
            current = found.current or "(none: not a gateway database, or never migrated)"
            raise SchemaNotCurrent(
                f"the database schema is at revision {current} and this gateway needs "
                f"{found.head}: run `python -m gateway migrate` (same database URL) first",
            )
        if writes:
            await store.close()
            store = open_store(parsed)
        yield store
    finally:
        await store.close()


async def list_runs(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    states = parse_states(args.states)
    now = utcnow()
    older = parse_duration(args.older_than) if args.older_than is not None else None
    found = await RunRepository(store).listing(
        statuses=states,
        changed_before=now - timedelta(seconds=older) if older is not None else None,
        tenant=args.tenant,
        thread_id=args.thread_id,
        limit=_limit(args.limit),
    )
    views = [output.run_view(leased, now) for leased in found]
    output.write_list(out, views, args.as_json, output.RUN_COLUMNS, output.run_cells)


async def show_run(store: Store, run_id: str, as_json: bool, out: TextIO) -> None:
    leased = await RunRepository(store).get_leased(run_id)
    if leased is None:
        raise not_found(f"no run {run_id!r} in this database")
    run = leased.run
    thread = await ThreadRepository(store).get(run.thread_id)
    approvals = await ApprovalRepository(store).for_checkpoint(run.run_id, run.checkpoint_version)
    view = output.run_detail(leased, thread, approvals, utcnow())
    if as_json:
        output.write_json(out, view)
    else:
        output.write_fields(out, view)


async def cancel(store: Store, settings: Settings, args: argparse.Namespace, out: TextIO) -> None:
    # Only here: the cancellation's imports reach the Agents SDK (checkpoints, sessions), whose
    # import takes seconds that the read-only commands need not wait for.
    from gateway.operator.cancel import cancel_run
    from gateway.run_lifecycle.cancellation import HeldElsewhere

    run = await RunRepository(store).get(args.run_id)
    if run is None:
        raise not_found(f"no run {args.run_id!r} in this database")
    if run.status.terminal:
        raise conflict(f"run {run.run_id} already {run.status.value}")
    try:
        done = await cancel_run(store, settings, run, force=args.force, actor=args.actor)
    except HeldElsewhere as exc:
        raise conflict(
            f"run {run.run_id} is streamed by gateway process {exc.holder.owner} right now "
            f"(its lease runs until {utc_ts(exc.holder.expires_at)}): cancel it through the "
            "gateway (run.cancel, as the run's owner or an admin), or pass --force to revoke "
            "the lease (that process stops the run at its next lease renewal)"
        ) from None
    except StaleWrite:
        raise conflict(f"run {run.run_id} changed while cancelling; look again") from None
    out.write(f"cancelled run {run.run_id} (was {run.status.value})\n")
    if done.superseded:
        out.write(f"superseded approvals: {', '.join(done.superseded)}\n")
    if done.queued_inputs:
        print(
            f"note: {done.queued_inputs} input(s) stay queued on thread {run.thread_id}; this "
            "command starts no runs, and a gateway starts the next one when a run of the "
            "thread ends there",
            file=sys.stderr,
        )


async def list_approvals(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    pending = await ApprovalRepository(store).pending(tenant=args.tenant, limit=_limit(args.limit))
    now = utcnow()
    views = [output.pending_view(approval, now) for approval in pending]
    output.write_list(out, views, args.as_json, output.APPROVAL_COLUMNS, output.approval_cells)


async def list_threads(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    archived = {"no": False, "only": True, "too": None}[args.archived]
    found = await ThreadRepository(store).list_for(
        tenant=args.tenant, owner=args.owner, limit=_limit(args.limit), archived=archived
    )
    views = [output.thread_view(thread) for thread in found]
    output.write_list(out, views, args.as_json, output.THREAD_COLUMNS, output.thread_cells)


async def export_thread(store: Store, thread_id: str, after_seq: int, out: TextIO) -> None:
    """Every stored event of the thread after `after_seq`: each line the `event` frame a
    replay sends a subscriber without the reviewer or admin role (docs/protocol.md §5), from
    the rows as stored, which hold sensitive arguments masked."""
    if await ThreadRepository(store).get(thread_id) is None:
        raise not_found(f"no thread {thread_id!r} in this database")
    cursor = after_seq
    while True:
        page = encode_page(await store.read_events(thread_id, after_seq=cursor, limit=EXPORT_PAGE))
        for event in page:
            out.write(event.frame)
            out.write("\n")
        if len(page) < EXPORT_PAGE:
            return
        cursor = page[-1].seq


def _limit(value: int) -> int:
    if value < 1:
        raise FilterError(f"--limit must be at least 1, not {value}")
    return value
