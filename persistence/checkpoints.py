"""Checkpoints: serialized SDK RunStates, versioned per run.

A checkpoint is written in the same transaction as the run's new status (and, for a pause, the
approvals it raises and their events), guarded by the run's current checkpoint version.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, fields, replace
from datetime import datetime
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Integer, String, bindparam, delete, exists, func, insert, select, update
from sqlalchemy.engine import Connection, RowMapping
from sqlalchemy.sql.dml import Update

from persistence.clock import as_utc, utcnow
from persistence.errors import StaleWrite
from persistence.leases import Lease, LeaseLost, lost_in
from persistence.prepared import Prepared
from persistence.run_status import RunStatus, check_moves, moves_into
from persistence.runs import EXPECTED_STATUS
from persistence.session_marks import SessionMarks
from persistence.tables import checkpoints, runs

if TYPE_CHECKING:
    from persistence.store import Store

# The reasons of the states a run ended with (kept for inspection, never resumed): every other
# checkpoint is a boundary a run can go on from.
FINAL_REASONS = ("completed", "error")


@dataclass(frozen=True)
class CheckpointRecord:
    run_id: str
    version: int
    state: str
    sdk_schema_version: str
    graph_name: str
    graph_version: str
    reason: str
    session_mark: int
    created_at: datetime

    @classmethod
    def from_row(cls, row: RowMapping | dict[str, Any]) -> CheckpointRecord:
        return cls(
            run_id=row["run_id"],
            version=int(row["version"]),
            state=row["state"],
            sdk_schema_version=row["sdk_schema_version"],
            graph_name=row["graph_name"],
            graph_version=row["graph_version"],
            reason=row["reason"],
            session_mark=int(row["session_mark"]),
            created_at=as_utc(row["created_at"]) or utcnow(),
        )


def _row(checkpoint: CheckpointRecord) -> dict[str, object]:
    return {
        "run_id": checkpoint.run_id,
        "version": checkpoint.version,
        "state": checkpoint.state,
        "sdk_schema_version": checkpoint.sdk_schema_version,
        "graph_name": checkpoint.graph_name,
        "graph_version": checkpoint.graph_version,
        "reason": checkpoint.reason,
        "session_mark": checkpoint.session_mark,
        "created_at": checkpoint.created_at,
    }


class CheckpointRepository:
    def __init__(self, store: Store) -> None:
        self._store = store

    @staticmethod
    def save_in(
        conn: Connection,
        checkpoint: CheckpointRecord,
        *,
        status: RunStatus,
        expected: Collection[RunStatus],
        session_of: str | None = None,
        lease: Lease | None = None,
        release: bool = False,
    ) -> CheckpointRecord:
        """Store `checkpoint` as the run's next version and move the run's status, atomically;
        returns what was stored.

        Raises `StaleWrite` if the run is no longer at `checkpoint.version - 1` in one of
        `expected` (cancelled, or another writer moved it on); nothing is stored then, so an
        older snapshot can never overwrite a newer one.

        With `session_of` (the run's thread), the stored `session_mark` is that session's head
        read in this transaction: right for a state taken after the stream ended, when nothing
        writes to the session any more, and one round trip fewer than reading it before.

        With `lease`, the move is fenced by it: made only while `lease` is the run's current
        lease, else `LeaseLost` (nothing stored); `release` frees it in the same step. The
        move locks the run's row, so nobody takes the lease over before the commit.

        Raises `IllegalRunTransition` if a move from one of `expected` to `status` is not
        allowed.
        """
        check_moves(expected, status)
        fence = _Fence.of(lease, release=release)
        params = _status_params(status, expected)
        return _advance(conn, checkpoint, _ADVANCES[False, fence], params, session_of, lease)

    @staticmethod
    def add_final_in(
        conn: Connection,
        checkpoint: CheckpointRecord,
        *,
        status: RunStatus,
        error: dict[str, Any] | None = None,
        session_of: str | None = None,
        keep_previous: bool = False,
        lease: Lease | None = None,
    ) -> CheckpointRecord:
        """End the run with the state it ended with: move it to its final `status` (from
        any status that may move there, recording `error`) and store `checkpoint` as its next
        version, in one step, under the same rule as `save_in`: never over a newer checkpoint
        (`StaleWrite`, nothing changed). `session_of` as in `save_in`. `keep_previous`: the
        checkpoint before this one stays (a failed run's last boundary, which a retry goes on
        from). `lease`: the step is fenced by the run's lease and frees it (`save_in`'s
        `release`).
        """
        params = _status_params(status, moves_into(status))
        if error is not None:
            params["b_error"] = error
        advance = _ADVANCES[error is not None, _Fence.of(lease, release=True)]
        keep = 1 if keep_previous else 0
        return _advance(conn, checkpoint, advance, params, session_of, lease, keep=keep)

    async def latest_resumable(self, run_id: str) -> CheckpointRecord | None:
        """The run's newest checkpoint that is not a final state: where a retry goes on."""
        return await self._store.read(lambda conn: _one(conn, _LATEST_RESUMABLE, {"b_run": run_id}))

    @staticmethod
    def drop_in(conn: Connection, run_id: str) -> None:
        """Remove every checkpoint of a run that ended without a final state (cancelled, or
        failed in a state that would not serialize): a terminal run is never resumed."""
        _DROP.rowcount(conn, {"b_run": run_id})

    async def latest(self, run_id: str) -> CheckpointRecord | None:
        return await self._store.read(partial(self.latest_in, run_id=run_id))

    @staticmethod
    def latest_in(conn: Connection, run_id: str) -> CheckpointRecord | None:
        return _one(conn, _LATEST, {"b_run": run_id})


def _one(conn: Connection, query: Prepared, params: dict[str, Any]) -> CheckpointRecord | None:
    row = query.record(conn, params)
    return CheckpointRecord.from_row(row) if row else None


_LATEST = Prepared(
    select(checkpoints)
    .where(checkpoints.c.run_id == bindparam("b_run"))
    .order_by(checkpoints.c.version.desc())
    .limit(1)
)
_LATEST_RESUMABLE = Prepared(
    select(checkpoints)
    .where(
        checkpoints.c.run_id == bindparam("b_run"),
        *(checkpoints.c.reason != reason for reason in FINAL_REASONS),
    )
    .order_by(checkpoints.c.version.desc())
    .limit(1)
)


class _Fence(Enum):
    """What a checkpoint's move does with the run's lease."""

    NONE = "none"  # nothing: the caller fenced the write, or it has no lease
    HELD = "held"  # made only while the lease is the run's current one
    FREED = "freed"  # that, and the lease is released with the move

    @classmethod
    def of(cls, lease: Lease | None, *, release: bool) -> _Fence:
        if lease is None:
            return cls.NONE
        return cls.FREED if release else cls.HELD


def _move(with_error: bool, fence: _Fence) -> Update:
    """A run's move to its next checkpoint version, from the one before and from one of the
    expected statuses, to its new status (and, ending failed, its error)."""
    statement = update(runs).where(
        runs.c.run_id == bindparam("b_run"),
        runs.c.checkpoint_version == bindparam("b_previous"),
        EXPECTED_STATUS.of(runs.c.status),
    )
    values: dict[str, Any] = {
        "checkpoint_version": bindparam("b_version"),
        "status": bindparam("b_status"),
        "updated_at": bindparam("b_now"),
    }
    if with_error:
        values["error"] = bindparam("b_error", type_=runs.c.error.type)
    if fence is not _Fence.NONE:
        # The lease as the event log's fencing read checks it (`held_of_in`): the same owner
        # and token.
        statement = statement.where(
            runs.c.lease_owner == bindparam("b_lease_owner"),
            runs.c.lease_token == bindparam("b_lease_token"),
        )
    if fence is _Fence.FREED:
        values.update(lease_owner=None, lease_expires_at=None)
    return statement.values(**values)


def _status_params(status: RunStatus, expected: Collection[RunStatus]) -> dict[str, Any]:
    return {
        **EXPECTED_STATUS.params([s.value for s in expected]),
        "b_status": status.value,
        "b_now": utcnow(),
    }


class _Advance(NamedTuple):
    """A checkpoint's move, as the statements of every backend and as PostgreSQL's one."""

    move: Prepared
    at_once: Prepared


def _at_once(move: Update) -> Prepared:
    """`_advance` as one statement on PostgreSQL: the move, the insert (its `session_mark`
    read from the session in the statement when `b_mark` is null), and the prune of older
    versions, each only if the move found the run where expected. One round trip where there
    were four (five at a run's end), each a turn of a busy loop for the event log's writer
    (docs/benchmarks.md, "PostgreSQL"); the run's row is locked first, as by the statements it
    replaces."""
    moved = move.returning(runs.c.run_id).cte("moved")
    head = SessionMarks.head_of(bindparam("b_session", type_=String))
    given = [c for c in checkpoints.c if c.name not in ("run_id", "session_mark")]
    values = select(
        moved.c.run_id,
        *(bindparam(f"b_{column.name}", type_=column.type) for column in given),
        func.coalesce(bindparam("b_mark", type_=Integer), head, 0),
    )
    inserted = (
        insert(checkpoints)
        .from_select(["run_id", *(c.name for c in given), "session_mark"], values)
        .returning(checkpoints.c.session_mark)
        .cte("inserted")
    )
    pruned = (
        delete(checkpoints)
        .where(
            checkpoints.c.run_id == bindparam("b_run"),
            checkpoints.c.version < bindparam("b_keep_from"),
            exists(select(moved.c.run_id)),
        )
        .returning(checkpoints.c.version)
        .cte("pruned")
    )
    # `pruned` is named in the result so that it is part of the statement at all.
    return Prepared(
        select(inserted.c.session_mark, select(func.count()).select_from(pruned).scalar_subquery())
    )


def _advance_of(move: Update) -> _Advance:
    return _Advance(Prepared(move), _at_once(move))


# Built once each: whether the move records an error, and what it does with the lease.
_ADVANCES = {
    (with_error, fence): _advance_of(_move(with_error, fence))
    for with_error in (False, True)
    for fence in _Fence
}
_INSERT = Prepared(checkpoints.insert(), keys=[field.name for field in fields(CheckpointRecord)])
_PRUNE = Prepared(
    delete(checkpoints).where(
        checkpoints.c.run_id == bindparam("b_run"), checkpoints.c.version < bindparam("b_version")
    )
)
_DROP = Prepared(delete(checkpoints).where(checkpoints.c.run_id == bindparam("b_run")))


def _advance(
    conn: Connection,
    checkpoint: CheckpointRecord,
    advance: _Advance,
    params: dict[str, Any],
    session_of: str | None,
    lease: Lease | None,
    keep: int = 0,
) -> CheckpointRecord:
    """Move the run from `checkpoint.version - 1` to `checkpoint.version` (`advance`, with
    `params`, fenced by `lease` if it has one) and insert the checkpoint; `StaleWrite` if the
    run is elsewhere, `LeaseLost` if `lease` no longer holds. `keep`: how many of the
    versions before it stay."""
    moving = {
        **params,
        "b_run": checkpoint.run_id,
        "b_version": checkpoint.version,
        "b_previous": checkpoint.version - 1,
    }
    if lease is not None:
        moving.update(b_lease_owner=lease.owner, b_lease_token=lease.token)
    # Nothing resumes from an older version once this one is durable (a continuation, a
    # recovery and a decision's binding check all read the run's current version), and each
    # older state repeats the conversation so far: dropped in the same transaction.
    keep_from = checkpoint.version - keep
    if conn.dialect.name == "postgresql":
        stored = _advance_at_once(conn, checkpoint, advance.at_once, moving, session_of, keep_from)
        if stored is None:
            raise _refused(conn, checkpoint, lease)
        return stored
    if session_of is not None:
        checkpoint = replace(checkpoint, session_mark=SessionMarks.head_in(conn, session_of))
    if advance.move.rowcount(conn, moving) != 1:
        raise _refused(conn, checkpoint, lease)
    _INSERT.rowcount(conn, _row(checkpoint))
    _PRUNE.rowcount(conn, {"b_run": checkpoint.run_id, "b_version": keep_from})
    return checkpoint


def _refused(conn: Connection, checkpoint: CheckpointRecord, lease: Lease | None) -> Exception:
    """Why a move found nothing to move: a lost lease comes first, as a fence read before the
    move would have found it; otherwise the run is not where the move expected it."""
    if lease is not None and lost_in(conn, {lease}):
        return LeaseLost(lease.run_id)
    return StaleWrite(f"run {checkpoint.run_id} is not at checkpoint {checkpoint.version - 1}")


def _advance_at_once(
    conn: Connection,
    checkpoint: CheckpointRecord,
    statement: Prepared,
    moving: dict[str, Any],
    session_of: str | None,
    keep_from: int,
) -> CheckpointRecord | None:
    """`_advance` in one statement (`_at_once`); None if the move found nothing to move."""
    row = _row(checkpoint)
    rows = statement.rows(
        conn,
        {
            **moving,
            **{f"b_{k}": v for k, v in row.items() if k not in ("run_id", "session_mark")},
            "b_keep_from": keep_from,
            "b_session": session_of,
            "b_mark": None if session_of is not None else checkpoint.session_mark,
        },
    )
    return replace(checkpoint, session_mark=int(rows[0][0])) if rows else None
