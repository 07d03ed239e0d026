"""The repositories' direct SQLite statements (persistence/direct.py) against their SQLAlchemy
versions: the same rows byte for byte, the same records read back, the same compare-and-swap
outcomes; and the event log's atomic commit on each path."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import event
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.eventlog import EventLog
from persistence.approvals import ApprovalRecord, ApprovalRepository, ApprovalStatus
from persistence.audit import AuditEntry, AuditRepository
from persistence.checkpoints import CheckpointRecord, CheckpointRepository
from persistence.direct import Codecs, Direct
from persistence.errors import StaleWrite
from persistence.inputs import Disposition, InputRepository
from persistence.leases import LeaseLost, LeaseRepository
from persistence.runs import RunRecord, RunRepository, RunStatus
from persistence.sessions import SessionMarks
from persistence.threads import ThreadRecord, ThreadRepository
from tests.support.storage import migrated_engine, running_event_log

T = TypeVar("T")
IDS = frozenset({"thread_id", "run_id", "approval_id"})
MOMENT = datetime(2026, 11, 29, 12, 30, 15, 123456, tzinfo=UTC)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "direct.db"


@pytest.fixture
async def engine(db_path: Path) -> AsyncIterator[AsyncEngine]:
    async with migrated_engine(db_path) as engine:
        yield engine


class Paths:
    """Runs the same change once through the engine, once on a direct connection."""

    def __init__(self, engine: AsyncEngine, db_path: Path) -> None:
        self.engine = engine
        self.db_path = db_path
        self.codecs = Codecs(engine.dialect)

    async def engine_tx(self, action: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        async with self.engine.begin() as conn:
            return await action(conn)

    def direct_tx(self, work: Callable[[Direct], T]) -> T:
        conn = sqlite3.connect(self.db_path, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            result = work(Direct(conn, self.codecs))
            conn.execute("COMMIT")
            return result
        finally:
            conn.close()

    def rows(self, table: str, key: str, *ids: str) -> list[tuple[Any, ...]]:
        """Whole rows, as stored, with their ids blanked so that twins compare equal."""
        conn = sqlite3.connect(self.db_path)
        try:
            marks = ",".join("?" * len(ids))
            cursor = conn.execute(f"SELECT * FROM {table} WHERE {key} IN ({marks})", ids)
            names = [d[0] for d in cursor.description]
            found = {row[names.index(key)]: row for row in cursor.fetchall()}
        finally:
            conn.close()
        return [
            tuple(None if n in IDS else v for n, v in zip(names, found[i], strict=True))
            for i in ids
        ]

    def all(self, sql: str) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(self.db_path)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()


@pytest.fixture
def paths(engine: AsyncEngine, db_path: Path) -> Paths:
    return Paths(engine, db_path)


def a_run(run_id: str, thread_id: str, **changes: Any) -> RunRecord:
    record = RunRecord(
        run_id=run_id,
        thread_id=thread_id,
        tenant="acme",
        owner="alice",
        status=RunStatus.RUNNING,
        agent="assistant",
        graph_version="1",
        on_disconnect="continue",
        input="hello \u00e9",
        checkpoint_version=0,
        session_mark=0,
        error=None,
        created_at=MOMENT,
        updated_at=MOMENT,
        requested_by="alice",
    )
    return replace(record, **changes)


def an_approval(approval_id: str, run_id: str, thread_id: str) -> ApprovalRecord:
    return ApprovalRecord(
        approval_id=approval_id,
        run_id=run_id,
        thread_id=thread_id,
        tenant="acme",
        checkpoint_version=1,
        call_id="call_1",
        tool_name="issue_refund",
        agent="assistant",
        arguments={"order": 42, "note": "caf\u00e9", "items": [1, None, 2.5]},
        arguments_digest="d" * 64,
        status=ApprovalStatus.PENDING,
        reviewer=None,
        reason=None,
        requested_at=MOMENT,
        decided_at=None,
        expires_at=MOMENT + timedelta(minutes=5),
    )


def a_checkpoint(run_id: str, version: int = 1) -> CheckpointRecord:
    return CheckpointRecord(
        run_id=run_id,
        version=version,
        state='{"state": true}',
        sdk_schema_version="1.0",
        graph_name="assistant",
        graph_version="1",
        reason="approval",
        session_mark=0,
        created_at=MOMENT,
    )


async def twin_threads(paths: Paths) -> tuple[ThreadRecord, ThreadRecord]:
    """One thread written by each path, with the same contents."""
    via_engine = ThreadRecord.new(
        tenant="acme", owner="alice", metadata={"k": [1, "\u00e9"]}, thread_id="t_e"
    )
    via_direct = replace(via_engine, thread_id="t_d")
    await paths.engine_tx(lambda conn: ThreadRepository.insert_record_in(conn, via_engine))
    paths.direct_tx(lambda db: ThreadRepository.insert_direct(db, via_direct))
    return via_engine, via_direct


async def twin_runs(paths: Paths, **changes: Any) -> None:
    """Runs r_e (engine) and r_d (direct) on the twin threads."""
    await twin_threads(paths)
    await paths.engine_tx(lambda conn: RunRepository.insert(conn, a_run("r_e", "t_e", **changes)))
    paths.direct_tx(lambda db: RunRepository.insert_direct(db, a_run("r_d", "t_d", **changes)))


async def add_session_messages(paths: Paths, thread_id: str, count: int) -> None:
    conn = sqlite3.connect(paths.db_path)
    try:
        conn.execute("INSERT OR IGNORE INTO agent_sessions (session_id) VALUES (?)", (thread_id,))
        conn.executemany(
            "INSERT INTO agent_messages (session_id, message_data) VALUES (?, ?)",
            [(thread_id, f'{{"n": {n}}}') for n in range(count)],
        )
        conn.commit()
    finally:
        conn.close()


def get_run(run_id: str, db: Direct) -> RunRecord | None:
    return RunRepository.get_direct(db, run_id)


def get_thread(thread_id: str, db: Direct) -> ThreadRecord | None:
    return ThreadRepository.get_direct(db, thread_id)


def insert_approvals(records: list[ApprovalRecord], db: Direct) -> None:
    ApprovalRepository.insert_direct(db, records)


async def test_inserts_store_identical_rows(paths: Paths) -> None:
    await twin_runs(paths)
    assert paths.rows("threads", "thread_id", "t_e") == paths.rows("threads", "thread_id", "t_d")
    # A JSON column stores None as JSON `null`, dates as SQLAlchemy's SQLite text.
    assert paths.rows("runs", "run_id", "r_e") == paths.rows("runs", "run_id", "r_d")

    records = (an_approval("ap_e", "r_e", "t_e"), an_approval("ap_d", "r_d", "t_d"))
    await paths.engine_tx(lambda conn: ApprovalRepository.insert_in(conn, [records[0]]))
    paths.direct_tx(lambda db: ApprovalRepository.insert_direct(db, [records[1]]))
    assert paths.rows("approvals", "approval_id", "ap_e") == paths.rows(
        "approvals", "approval_id", "ap_d"
    )

    entry = AuditEntry(
        action="approval.decided",
        outcome="ok",
        tenant="acme",
        actor="bob",
        target="x",
        details={"a": "\u00e9"},
        at=MOMENT,
    )
    await paths.engine_tx(lambda conn: AuditRepository.insert_in(conn, entry))
    paths.direct_tx(lambda db: AuditRepository.insert_direct(db, replace(entry, target="y")))
    stored = paths.all(
        "SELECT at, tenant, actor, action, outcome, source, details FROM audit ORDER BY audit_id"
    )
    assert stored[0] == stored[1]


async def test_reads_give_the_same_records(paths: Paths, engine: AsyncEngine) -> None:
    await twin_runs(paths, error={"code": "run_error", "message": "x"})
    for run_id, thread_id in (("r_e", "t_e"), ("r_d", "t_d")):
        direct_run = paths.direct_tx(partial(get_run, run_id))
        assert direct_run == await RunRepository(engine).get(run_id)
        assert direct_run == a_run(run_id, thread_id, error={"code": "run_error", "message": "x"})
        direct_thread = paths.direct_tx(partial(get_thread, thread_id))
        assert direct_thread == await ThreadRepository(engine).get(thread_id)
    approval = an_approval("ap_d", "r_d", "t_d")
    paths.direct_tx(lambda db: ApprovalRepository.insert_direct(db, [approval]))
    assert paths.direct_tx(lambda db: ApprovalRepository.get_direct(db, "ap_d")) == approval
    assert await ApprovalRepository(engine).get("ap_d") == approval
    assert paths.direct_tx(lambda db: ApprovalRepository.for_checkpoint_direct(db, "r_d", 1)) == [
        approval
    ]


async def test_checkpoints_take_the_session_mark_in_their_transaction(
    paths: Paths, engine: AsyncEngine
) -> None:
    await twin_runs(paths)
    await add_session_messages(paths, "t_e", 3)
    await add_session_messages(paths, "t_d", 3)
    expected = (RunStatus.RUNNING,)
    stored_e = await paths.engine_tx(
        lambda conn: CheckpointRepository.save_in(
            conn,
            a_checkpoint("r_e"),
            status=RunStatus.WAITING_FOR_REVIEW,
            expected=expected,
            session_of="t_e",
        )
    )
    stored_d = paths.direct_tx(
        lambda db: CheckpointRepository.save_direct(
            db,
            a_checkpoint("r_d"),
            status=RunStatus.WAITING_FOR_REVIEW,
            expected=expected,
            session_of="t_d",
        )
    )
    marks = SessionMarks(engine)
    assert stored_e.session_mark == await marks.head("t_e")
    assert stored_d.session_mark == await marks.head("t_d")
    assert stored_d.session_mark > 0
    latest = await CheckpointRepository(engine).latest("r_d")
    assert latest == stored_d
    assert paths.direct_tx(lambda db: CheckpointRepository.latest_direct(db, "r_d")) == stored_d
    # The run row moved the same way on both paths (the timestamps are the write's own).
    run_e, run_d = [await RunRepository(engine).get(r) for r in ("r_e", "r_d")]
    assert run_e is not None and run_d is not None
    assert (run_e.status, run_e.checkpoint_version) == (run_d.status, run_d.checkpoint_version)
    # The same guard: never over a version that is not the previous one.
    with pytest.raises(StaleWrite):
        paths.direct_tx(
            lambda db: CheckpointRepository.save_direct(
                db,
                a_checkpoint("r_d", 3),
                status=RunStatus.RUNNING,
                expected=(RunStatus.WAITING_FOR_REVIEW,),
            )
        )
    final = replace(a_checkpoint("r_d", 2), reason="completed")
    stored = paths.direct_tx(
        lambda db: CheckpointRepository.add_final_direct(db, final, session_of="t_d")
    )
    assert stored.session_mark == stored_d.session_mark
    assert await CheckpointRepository(engine).latest("r_d") == stored


async def test_compare_and_swaps_agree(paths: Paths, engine: AsyncEngine) -> None:
    await twin_runs(paths)
    for run_id, thread_id, ap in (("r_e", "t_e", "ap_e"), ("r_d", "t_d", "ap_d")):
        paths.direct_tx(partial(insert_approvals, [an_approval(ap, run_id, thread_id)]))

    # transition: wins once, then the status no longer matches.
    moved_e = [
        await paths.engine_tx(
            lambda conn: RunRepository.transition_in(
                conn, "r_e", RunStatus.FAILED, expected=(RunStatus.RUNNING,), error={"code": "x"}
            )
        )
        for _ in range(2)
    ]
    moved_d = [
        paths.direct_tx(
            lambda db: RunRepository.transition_direct(
                db, "r_d", RunStatus.FAILED, expected=(RunStatus.RUNNING,), error={"code": "x"}
            )
        )
        for _ in range(2)
    ]
    assert moved_e == moved_d == [True, False]
    run_e, run_d = [await RunRepository(engine).get(r) for r in ("r_e", "r_d")]
    assert run_e is not None and run_d is not None
    assert (
        (run_e.status, run_e.error)
        == (run_d.status, run_d.error)
        == (RunStatus.FAILED, {"code": "x"})
    )
    assert not paths.direct_tx(
        lambda db: RunRepository.transition_direct(
            db, "r_d", RunStatus.RUNNING, expected=(RunStatus.FAILED,), checkpoint_version=5
        )
    )

    # decide: at most once, and only at the approval's checkpoint version.
    def decide_direct(version: int, db: Direct) -> bool:
        return ApprovalRepository.decide_direct(
            db,
            "ap_d",
            status=ApprovalStatus.APPROVED,
            reviewer="bob",
            reason="ok",
            checkpoint_version=version,
            decided_at=MOMENT,
        )

    async def decide_in(conn: AsyncConnection) -> bool:
        return await ApprovalRepository.decide_in(
            conn,
            "ap_e",
            status=ApprovalStatus.APPROVED,
            reviewer="bob",
            reason="ok",
            checkpoint_version=1,
            decided_at=MOMENT,
        )

    assert not paths.direct_tx(partial(decide_direct, 2))
    decided_e = [await paths.engine_tx(decide_in) for _ in range(2)]
    decided_d = [paths.direct_tx(partial(decide_direct, 1)) for _ in range(2)]
    assert decided_e == decided_d == [True, False]
    assert (
        paths.rows("approvals", "approval_id", "ap_e")[0][3:]
        == paths.rows("approvals", "approval_id", "ap_d")[0][3:]
    )

    # supersede: decided or pending rows, once; the pending ones of a run.
    for ap, run_id, thread_id in (("ap_e2", "r_e", "t_e"), ("ap_d2", "r_d", "t_d")):
        record = replace(an_approval(ap, run_id, thread_id), call_id="call_2")
        paths.direct_tx(partial(insert_approvals, [record]))
    assert await paths.engine_tx(
        lambda conn: ApprovalRepository.supersede_pending_in(conn, "r_e")
    ) == ["ap_e2"]
    assert paths.direct_tx(lambda db: ApprovalRepository.supersede_pending_direct(db, "r_d")) == [
        "ap_d2"
    ]
    assert paths.direct_tx(
        lambda db: ApprovalRepository.supersede_direct(db, ["ap_d", "ap_d2", "nope"], reason="r")
    ) == ["ap_d"]
    assert await paths.engine_tx(
        lambda conn: ApprovalRepository.supersede_in(conn, ["ap_e", "ap_e2"], reason="r")
    ) == ["ap_e"]
    for ap in ("ap_e", "ap_d"):
        row = await ApprovalRepository(engine).get(ap)
        assert row is not None and (row.status, row.reason) == (ApprovalStatus.SUPERSEDED, "r")


async def test_leases_and_inputs_agree(paths: Paths, engine: AsyncEngine) -> None:
    await twin_runs(paths)
    lease_e = await paths.engine_tx(lambda conn: LeaseRepository.acquire_in(conn, "r_e", "gw", 15))
    lease_d = paths.direct_tx(lambda db: LeaseRepository.acquire_direct(db, "r_d", "gw", 15))
    assert lease_e is not None and lease_d is not None and lease_e.token == lease_d.token == 1
    # Held by a live owner: another one cannot take it; the same owner (a restart) can.
    assert (
        paths.direct_tx(lambda db: LeaseRepository.acquire_direct(db, "r_d", "other", 15)) is None
    )
    again = paths.direct_tx(lambda db: LeaseRepository.acquire_direct(db, "r_d", "gw", 15))
    assert again is not None and again.token == 2
    with pytest.raises(LeaseLost):
        paths.direct_tx(lambda db: LeaseRepository.fence_direct(db, lease_d))
    paths.direct_tx(lambda db: LeaseRepository.fence_direct(db, again))
    paths.direct_tx(lambda db: LeaseRepository.release_direct(db, again))
    assert await LeaseRepository(engine).acquire("r_d", "other", 15) is not None

    repo = InputRepository(engine)
    for run_id, thread_id in (("r_e", "t_e"), ("r_d", "t_d")):
        stage = partial(
            InputRepository.insert_in,
            thread_id=thread_id,
            run_id=run_id,
            text="more",
            disposition=Disposition.STAGED,
            sender="alice",
        )
        await paths.engine_tx(stage)
    staged_d = paths.direct_tx(
        lambda db: InputRepository.open_direct(
            db, thread_id="t_d", disposition=Disposition.STAGED, run_id="r_d"
        )
    )
    assert staged_d == await repo.open(
        thread_id="t_d", disposition=Disposition.STAGED, run_id="r_d"
    )
    paths.direct_tx(
        lambda db: InputRepository.consume_direct(db, [staged_d[0].input_id], run_id="r_d")
    )
    staged_e = await repo.open(thread_id="t_e", disposition=Disposition.STAGED, run_id="r_e")
    await paths.engine_tx(
        lambda conn: InputRepository.consume_in(conn, [staged_e[0].input_id], run_id="r_e")
    )
    assert await repo.open(thread_id="t_d", disposition=Disposition.STAGED) == []
    stored = paths.all(
        "SELECT thread_id, run_id, consumed_at IS NOT NULL FROM pending_inputs ORDER BY 1 DESC"
    )
    assert stored == [("t_e", "r_e", 1), ("t_d", "r_d", 1)]


# -- the event log's atomic commit ---------------------------------------------------------


@pytest.fixture
async def log(engine: AsyncEngine) -> AsyncIterator[EventLog]:
    async with running_event_log(engine) as log:
        yield log


async def test_an_atomic_commit_takes_the_direct_path_unless_statements_are_observed(
    engine: AsyncEngine, log: EventLog
) -> None:
    thread = await ThreadRepository(engine).create(tenant="acme", owner="alice")
    used: list[str] = []

    async def action(conn: AsyncConnection) -> str:
        used.append("engine")
        await InputRepository.insert_in(
            conn, thread_id=thread.thread_id, run_id=None, text="a", disposition=Disposition.QUEUED
        )
        return "engine"

    def direct(db: Direct) -> str:
        used.append("direct")
        db.execute(
            "INSERT INTO pending_inputs (thread_id, input, disposition, created_at)"
            " VALUES (?, 'b', 'queued', '2026-01-01 00:00:00.000000')",
            (thread.thread_id,),
        )
        return "direct"

    first = log.new_event(thread.thread_id, None, "x", {"n": 1})
    result, logged = await log.commit([first], action, direct)
    assert (result, [e.seq for e in logged]) == ("direct", [1])

    statements: list[str] = []

    def observe(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", observe)
    try:
        second = log.new_event(thread.thread_id, None, "x", {"n": 2})
        result, logged = await log.commit([second], action, direct)
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", observe)
    assert (result, [e.seq for e in logged]) == ("engine", [2])
    assert any("INSERT INTO pending_inputs" in s for s in statements)
    assert used == ["direct", "engine"]
    # An action without a direct version always runs on the engine.
    result, _ = await log.commit((), action)
    assert result == "engine"


async def test_a_failing_direct_commit_stores_nothing(engine: AsyncEngine, log: EventLog) -> None:
    thread = await ThreadRepository(engine).create(tenant="acme", owner="alice")

    def stale(db: Direct) -> None:
        ThreadRepository.insert_direct(
            db, ThreadRecord.new(tenant="acme", owner="x", metadata=None, thread_id="t_never")
        )
        raise StaleWrite("moved on")

    with pytest.raises(StaleWrite):
        await log.commit([log.new_event(thread.thread_id, None, "x", {})], None, stale)
    assert await ThreadRepository(engine).get("t_never") is None

    def duplicate(db: Direct) -> None:
        ThreadRepository.insert_direct(db, replace(thread, head_seq=0))

    # The engine's exception type, so callers (a run start racing another) handle one type.
    with pytest.raises(IntegrityError):
        await log.commit([log.new_event(thread.thread_id, None, "x", {})], None, duplicate)
    await run_and_lose_a_lease(engine, log, thread.thread_id)
    stored = await ThreadRepository(engine).get(thread.thread_id)
    assert stored is not None and stored.head_seq == 0  # nothing of the failed commits


async def run_and_lose_a_lease(engine: AsyncEngine, log: EventLog, thread_id: str) -> None:
    async with engine.begin() as conn:
        await RunRepository.insert(conn, a_run("r_1", thread_id))
        old = await LeaseRepository.acquire_in(conn, "r_1", "gw", 15)
        assert old is not None
        assert await LeaseRepository.acquire_in(conn, "r_1", "gw", 15) is not None
    with pytest.raises(LeaseLost):
        await log.commit([log.new_event(thread_id, "r_1", "x", {}, old)], None, lambda db: None)


async def test_renewing_all_leases_agrees_on_both_paths(paths: Paths, engine: AsyncEngine) -> None:
    await twin_runs(paths)
    lease_e = await paths.engine_tx(lambda conn: LeaseRepository.acquire_in(conn, "r_e", "gw", 15))
    lease_d = paths.direct_tx(lambda db: LeaseRepository.acquire_direct(db, "r_d", "gw", 15))
    assert lease_e is not None and lease_d is not None
    # A stale token (the lease was taken again since) and another owner's claim are not renewed.
    stale = replace(lease_d, token=lease_d.token - 1)
    foreign = replace(lease_e, owner="other")
    before = paths.all("SELECT run_id, lease_expires_at FROM runs ORDER BY run_id")
    asked = [lease_e, lease_d, stale, foreign]
    via_engine = await paths.engine_tx(lambda conn: LeaseRepository.renew_all_in(conn, asked, 60))
    after_engine = paths.all("SELECT run_id, lease_expires_at FROM runs ORDER BY run_id")
    via_direct = paths.direct_tx(lambda db: LeaseRepository.renew_all_direct(db, asked, 120))
    after_direct = paths.all("SELECT run_id, lease_expires_at FROM runs ORDER BY run_id")
    assert via_engine == via_direct == {lease_e, lease_d}
    # Each renewal moved both expiries forward, stored in the engine's datetime format.
    for (_, old), (_, mid), (_, new) in zip(before, after_engine, after_direct, strict=True):
        assert old < mid < new
        assert len(old) == len(mid) == len(new)
    assert await paths.engine_tx(lambda conn: LeaseRepository.renew_all_in(conn, [], 60)) == set()
