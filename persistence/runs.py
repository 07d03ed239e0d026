"""Runs: one application-level turn and its lifecycle status."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Integer, Select, bindparam, func, select, text, update
from sqlalchemy.engine import Connection, RowMapping

from persistence.clock import as_utc, utcnow
from persistence.leases import TAKEABLE, TAKEN, Lease, LeaseHolder, taking_params
from persistence.prepared import OneOf, Prepared

# Re-exported: callers read the active and terminal sets along with the repository.
from persistence.run_status import ACTIVE as ACTIVE
from persistence.run_status import TERMINAL as TERMINAL
from persistence.run_status import RunStatus, check_moves
from persistence.session_marks import SessionMarks
from persistence.tables import ACTIVE_RUN_SQL, approvals, runs

if TYPE_CHECKING:
    from persistence.store import Store


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    thread_id: str
    tenant: str
    owner: str
    status: RunStatus
    agent: str
    graph_version: str
    on_disconnect: str
    input: str
    checkpoint_version: int
    session_mark: int
    error: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    # Who started the run, or sent the input that started it (the four-eyes "requester");
    # None for runs created before it was recorded.
    requested_by: str | None = None
    # What the run's context keeps of the token that asked for it: {"roles", "claims"}
    # (gateway/agents/run_caller.py); None for runs created before it was recorded.
    caller: dict[str, Any] | None = None
    # The scope its side effects are recorded under in the operation ledger, when it is not
    # the run's own id: a retry shares the scope of the failed run it continues.
    ledger_scope: str | None = None

    @property
    def operations_scope(self) -> str:
        """The scope of the run's entries in the operation ledger."""
        return self.ledger_scope or self.run_id

    def values(self) -> dict[str, Any]:
        """The row to insert for a new run."""
        return {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "tenant": self.tenant,
            "owner": self.owner,
            "status": self.status.value,
            "agent": self.agent,
            "graph_version": self.graph_version,
            "on_disconnect": self.on_disconnect,
            "input": self.input,
            "checkpoint_version": self.checkpoint_version,
            "session_mark": self.session_mark,
            "error": self.error,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "requested_by": self.requested_by,
            "caller": self.caller,
            "ledger_scope": self.ledger_scope,
        }

    @classmethod
    def from_row(cls, row: RowMapping | dict[str, Any]) -> RunRecord:
        return cls(
            run_id=row["run_id"],
            thread_id=row["thread_id"],
            tenant=row["tenant"],
            owner=row["owner"],
            status=RunStatus(row["status"]),
            agent=row["agent"],
            graph_version=row["graph_version"],
            on_disconnect=row["on_disconnect"],
            input=row["input"],
            checkpoint_version=int(row["checkpoint_version"]),
            session_mark=int(row["session_mark"]),
            error=row["error"],
            created_at=as_utc(row["created_at"]) or utcnow(),
            updated_at=as_utc(row["updated_at"]) or utcnow(),
            requested_by=row.get("requested_by"),
            caller=row.get("caller"),
            ledger_scope=row.get("ledger_scope"),
        )


@dataclass(frozen=True)
class LeasedRun:
    """A run with its lease as its row holds it: what an operator needs to tell a run that a
    process streams from one nobody does any more."""

    run: RunRecord
    lease: LeaseHolder | None

    @classmethod
    def from_row(cls, row: RowMapping | dict[str, Any]) -> LeasedRun:
        return cls(
            RunRecord.from_row(row), LeaseHolder.of(row["lease_owner"], row["lease_expires_at"])
        )


class RunRepository:
    def __init__(self, store: Store) -> None:
        self._store = store

    @staticmethod
    def insert_in(conn: Connection, record: RunRecord) -> None:
        _INSERT.rowcount(conn, record.values())

    @staticmethod
    def insert_leased_in(conn: Connection, record: RunRecord, owner: str, ttl_s: float) -> Lease:
        """A new run, leased to `owner` from the start: the row inserting it and then taking
        its lease (`LeaseRepository.acquire_in`, the run's first: token 1) would leave, in one
        statement instead of two."""
        leased = {
            **record.values(),
            "lease_owner": owner,
            "lease_expires_at": utcnow() + timedelta(seconds=ttl_s),
            "lease_token": FIRST_LEASE_TOKEN,
        }
        _INSERT_LEASED.rowcount(conn, leased)
        return Lease(record.run_id, owner, FIRST_LEASE_TOKEN)

    async def get(self, run_id: str) -> RunRecord | None:
        return await self._store.read(partial(self.get_in, run_id=run_id))

    @staticmethod
    def get_in(conn: Connection, run_id: str) -> RunRecord | None:
        row = _BY_ID.record(conn, {"b_run": run_id})
        return RunRecord.from_row(row) if row else None

    async def get_leased(self, run_id: str) -> LeasedRun | None:
        row = await self._store.read(partial(_BY_ID.record, params={"b_run": run_id}))
        return LeasedRun.from_row(row) if row else None

    async def listing(
        self,
        *,
        statuses: Collection[RunStatus] = (),
        changed_before: datetime | None = None,
        tenant: str | None = None,
        thread_id: str | None = None,
        limit: int = 100,
    ) -> list[LeasedRun]:
        """Runs matching every filter given, the longest in their status first (a run's
        `updated_at` is its last status change): an operator looking for stuck runs."""
        query = select(runs)
        if statuses:
            query = query.where(runs.c.status.in_([s.value for s in statuses]))
        if changed_before is not None:
            query = query.where(runs.c.updated_at <= changed_before)
        if tenant is not None:
            query = query.where(runs.c.tenant == tenant)
        if thread_id is not None:
            query = query.where(runs.c.thread_id == thread_id)
        query = query.order_by(runs.c.updated_at, runs.c.run_id).limit(limit)
        return await self._store.read(
            lambda conn: [LeasedRun.from_row(row) for row in conn.execute(query).mappings()]
        )

    async def of_thread(self, thread_id: str, limit: int = 1000) -> list[RunRecord]:
        """The thread's runs in the order they were started (the newest `limit` of them)."""
        query = (
            select(runs)
            .where(runs.c.thread_id == thread_id)
            .order_by(runs.c.created_at.desc(), runs.c.run_id.desc())
            .limit(limit)
        )
        return list(reversed(await self._store.read(partial(_records, query))))

    async def active_for_thread(self, thread_id: str) -> RunRecord | None:
        return await self._store.read(partial(self.active_for_thread_in, thread_id=thread_id))

    @staticmethod
    def active_for_thread_in(conn: Connection, thread_id: str) -> RunRecord | None:
        row = _ACTIVE_ON_THREAD.record(conn, {"b_thread": thread_id})
        return RunRecord.from_row(row) if row else None

    async def with_status(self, statuses: Iterable[RunStatus]) -> list[RunRecord]:
        query = (
            select(runs)
            .where(runs.c.status.in_([s.value for s in statuses]))
            .order_by(runs.c.created_at)
        )
        return await self._store.read(partial(_records, query))

    async def decided_but_waiting(self, limit: int = 500) -> list[RunRecord]:
        """Paused runs whose every approval is decided: their continuation did not start
        (it failed, or its process died in between) and must be retried."""
        pending = (
            select(approvals.c.approval_id)
            .where(
                approvals.c.run_id == runs.c.run_id,
                approvals.c.checkpoint_version == runs.c.checkpoint_version,
                approvals.c.status == "pending",
            )
            .exists()
        )
        query = (
            select(runs)
            .where(runs.c.status == RunStatus.WAITING_FOR_REVIEW.value, ~pending)
            .limit(limit)
        )
        return await self._store.read(partial(_records, query))

    async def transition(
        self,
        run_id: str,
        to: RunStatus,
        *,
        expected: Iterable[RunStatus],
        checkpoint_version: int | None = None,
        error: dict[str, Any] | None = None,
    ) -> bool:
        """Compare-and-swap the status; True when this caller won."""
        return await self._store.write(
            partial(
                self.transition_in,
                run_id=run_id,
                to=to,
                expected=expected,
                checkpoint_version=checkpoint_version,
                error=error,
            )
        )

    @staticmethod
    def transition_in(
        conn: Connection,
        run_id: str,
        to: RunStatus,
        *,
        expected: Iterable[RunStatus],
        checkpoint_version: int | None = None,
        error: dict[str, Any] | None = None,
    ) -> bool:
        """Compare-and-swap the status; True when this caller won. Raises
        `IllegalRunTransition` if a move from one of `expected` to `to` is not allowed."""
        params = _swap_params(run_id, to, expected, checkpoint_version, error)
        statement = _TRANSITIONS[(checkpoint_version is not None, error is not None, False)]
        return statement.rowcount(conn, params) == 1

    @staticmethod
    def transition_returning_in(
        conn: Connection, run_id: str, to: RunStatus, *, expected: Iterable[RunStatus]
    ) -> RunRecord | None:
        """`transition_in`, giving the run as the swap left it (None when this caller lost):
        the statement that moves it also reads it back."""
        statement = _TRANSITIONS[(False, False, True)]
        row = statement.record(conn, _swap_params(run_id, to, expected, None, None))
        return RunRecord.from_row(row) if row else None

    @staticmethod
    def take_lease_moving_in(
        conn: Connection,
        run_id: str,
        to: RunStatus,
        *,
        expected: Iterable[RunStatus],
        owner: str,
        ttl_s: float,
        incarnation: str | None,
        checkpoint_version: int | None = None,
        through: RunStatus | None = None,
        trim_session_after: int | None = None,
    ) -> tuple[Lease, RunRecord] | None:
        """Take the run's lease (as `LeaseRepository.acquire_in`) and swap its status (as
        `transition_returning_in`) in one statement: the lease and the run as it left them, or
        None when either step would refuse (taken one after the other, they tell which). A
        continuation's start: one round trip where there were two.

        `checkpoint_version`: only from that version. `through`: two swaps in one, from
        `expected` to `through` and from there to `to`, each checked as a move of its own;
        no other transaction can see the run in `through` (a decision's claim of the
        continuation and the start it makes: one round trip where there were three).
        `trim_session_after`: once taken, the run's thread's session loses its messages after
        that mark (`SessionMarks.trim_in`), on PostgreSQL in the same statement."""
        params = {
            **_swap_params(run_id, to, expected, checkpoint_version, None, through=through),
            **taking_params(run_id, owner, ttl_s, incarnation),
        }
        takes = _TAKES_MOVING[checkpoint_version is not None]
        if trim_session_after is not None and conn.dialect.name == "postgresql":
            row = takes.trimming.record(conn, {**params, "b_mark": trim_session_after})
        else:
            row = takes.alone.record(conn, params)
            if row and trim_session_after is not None:
                SessionMarks.trim_in(conn, row["thread_id"], trim_session_after)
        if not row:
            return None
        return Lease(run_id, owner, int(row["lease_token"])), RunRecord.from_row(row)


def _swap_params(
    run_id: str,
    to: RunStatus,
    expected: Iterable[RunStatus],
    checkpoint_version: int | None,
    error: dict[str, Any] | None,
    through: RunStatus | None = None,
) -> dict[str, Any]:
    """A status compare-and-swap's parameters, once the move (by way of `through`, if given)
    is found allowed (else `IllegalRunTransition`)."""
    expected = tuple(expected)
    if through is not None:
        check_moves(expected, through)
        check_moves((through,), to)
    else:
        check_moves(expected, to)
    return {
        "b_run": run_id,
        **EXPECTED_STATUS.params([s.value for s in expected]),
        "b_status": to.value,
        "b_now": utcnow(),
        "b_version": checkpoint_version,
        "b_error": error,
    }


# The statuses a compare-and-swap moves a run from.
EXPECTED_STATUS = OneOf("b_expected", len(RunStatus))
# A new run's row: every field of the record (`RunRecord.values`).
_INSERT = Prepared(runs.insert(), keys=[field.name for field in fields(RunRecord)])
_INSERT_LEASED = Prepared(
    runs.insert(),
    keys=[field.name for field in fields(RunRecord)]
    + ["lease_owner", "lease_expires_at", "lease_token"],
)
# A new row's `lease_token` is 0; each lease taken adds one.
FIRST_LEASE_TOKEN = 1
_BY_ID = Prepared(select(runs).where(runs.c.run_id == bindparam("b_run")))


def _transition(at_version: bool, with_error: bool, returning: bool) -> Prepared:
    """The status compare-and-swap: only from an expected status (and checkpoint version);
    `returning` the row it changed."""
    statement = update(runs).where(
        runs.c.run_id == bindparam("b_run"),
        EXPECTED_STATUS.of(runs.c.status),
    )
    if at_version:
        statement = statement.where(runs.c.checkpoint_version == bindparam("b_version"))
    values: dict[str, Any] = {"status": bindparam("b_status"), "updated_at": bindparam("b_now")}
    if with_error:
        values["error"] = bindparam("b_error", type_=runs.c.error.type)
    statement = statement.values(**values)
    return Prepared(statement.returning(*runs.c) if returning else statement)


# Built once each: whether the swap also checks the checkpoint version, records an error, and
# returns the row.
_TRANSITIONS = {
    (v, e, r): _transition(v, e, r)
    for v in (False, True)
    for e in (False, True)
    for r in (False, True)
}


class _TakeMoving(NamedTuple):
    """The lease taken with a status swap: alone, and with the trim of the run's session
    after `b_mark` in the same statement (PostgreSQL), made only if the take was."""

    alone: Prepared
    trimming: Prepared


def _take_moving(at_version: bool) -> _TakeMoving:
    """`_TakeMoving`, only at a checkpoint version if `at_version`."""
    statement = update(runs).where(
        runs.c.run_id == bindparam("b_run"), EXPECTED_STATUS.of(runs.c.status), TAKEABLE
    )
    if at_version:
        statement = statement.where(runs.c.checkpoint_version == bindparam("b_version"))
    take = statement.values(
        **TAKEN, status=bindparam("b_status"), updated_at=bindparam("b_now")
    ).returning(*runs.c)
    moved = take.cte("moved")
    trimmed = SessionMarks.trim_of(
        select(moved.c.thread_id).scalar_subquery(), bindparam("b_mark", type_=Integer)
    ).cte("trimmed")
    # `trimmed` is named in the result so that it is part of the statement at all.
    removed = select(func.count()).select_from(trimmed).scalar_subquery().label("b_trimmed")
    return _TakeMoving(Prepared(take), Prepared(select(moved, removed)))


# By whether the swap also checks the checkpoint version.
_TAKES_MOVING = {at_version: _take_moving(at_version) for at_version in (False, True)}
# The active-run predicate as the partial index on thread_id states it (a literal IN list
# would be rendered anew at every execution).
_ACTIVE_ON_THREAD = Prepared(
    select(runs).where(runs.c.thread_id == bindparam("b_thread"), text(ACTIVE_RUN_SQL))
)


def _records(query: Select[Any], conn: Connection) -> list[RunRecord]:
    return [RunRecord.from_row(row) for row in conn.execute(query).mappings()]
