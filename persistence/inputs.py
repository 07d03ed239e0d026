"""Pending inputs: text a user sent while a run was paused (staged) or busy (queued)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import Exists, and_, bindparam, exists, func, or_, select, update
from sqlalchemy.engine import Connection

from persistence.clock import utcnow
from persistence.prepared import Prepared
from persistence.tables import pending_inputs

if TYPE_CHECKING:
    from persistence.store import Store


class Disposition(StrEnum):
    STAGED = "staged"
    QUEUED = "queued"


@dataclass(frozen=True)
class PendingInput:
    input_id: int
    thread_id: str
    run_id: str | None
    input: str
    disposition: Disposition
    sender: str | None = None
    # The sender's roles and chosen claims for the run a queued input starts (`runs.caller`).
    caller: dict[str, Any] | None = None


class InputRepository:
    def __init__(self, store: Store) -> None:
        self._store = store

    @staticmethod
    def insert_in(
        conn: Connection,
        *,
        thread_id: str,
        run_id: str | None,
        text: str,
        disposition: Disposition,
        sender: str | None = None,
        caller: dict[str, Any] | None = None,
    ) -> None:
        _INSERT.rowcount(
            conn,
            {
                "thread_id": thread_id,
                "run_id": run_id,
                "input": text,
                "disposition": disposition.value,
                "sender": sender,
                "caller": caller,
                "created_at": utcnow(),
            },
        )

    @staticmethod
    def consume_in(conn: Connection, input_ids: list[int], *, run_id: str | None = None) -> None:
        """Mark inputs as admitted (a queued input also records the run it started)."""
        if not input_ids:
            return
        params = {"b_ids": input_ids, "b_now": utcnow(), "b_run": run_id}
        conn.execute(_CONSUME if run_id is None else _CONSUME_FOR_RUN, params)

    async def count_open(self, *, thread_id: str, run_id: str) -> int:
        """Inputs still waiting on a thread: all queued ones, and those staged on `run_id`.

        Staged inputs of other (ended) runs are never admitted, so they do not count.
        """
        query = (
            select(func.count())
            .select_from(pending_inputs)
            .where(
                pending_inputs.c.thread_id == thread_id,
                pending_inputs.c.consumed_at.is_(None),
                or_(
                    pending_inputs.c.disposition == Disposition.QUEUED.value,
                    and_(
                        pending_inputs.c.disposition == Disposition.STAGED.value,
                        pending_inputs.c.run_id == run_id,
                    ),
                ),
            )
        )
        return await self._store.read(lambda conn: int(conn.execute(query).scalar_one()))

    async def open(
        self, *, thread_id: str, disposition: Disposition, run_id: str | None = None
    ) -> list[PendingInput]:
        return await self._store.read(
            partial(self.open_in, thread_id=thread_id, disposition=disposition, run_id=run_id)
        )

    @staticmethod
    def open_of_run() -> Exists:
        """Whether the run `b_run` has open input of `b_disposition` on its thread
        `b_thread` (what `open_in` would find): an expression, for a statement that reads it
        with something else."""
        return exists(_OPEN_OF_RUN_ANY.with_only_columns(pending_inputs.c.input_id).order_by(None))

    @staticmethod
    def open_in(
        conn: Connection,
        *,
        thread_id: str,
        disposition: Disposition,
        run_id: str | None = None,
    ) -> list[PendingInput]:
        query = _OPEN if run_id is None else _OPEN_OF_RUN
        params = {"b_thread": thread_id, "b_disposition": disposition.value, "b_run": run_id}
        rows = query.records(conn, params)
        return [
            PendingInput(
                input_id=row["input_id"],
                thread_id=row["thread_id"],
                run_id=row["run_id"],
                input=row["input"],
                disposition=Disposition(row["disposition"]),
                sender=row["sender"],
                caller=row["caller"],
            )
            for row in rows
        ]


_INSERT = Prepared(
    pending_inputs.insert(),
    keys=["thread_id", "run_id", "input", "disposition", "sender", "caller", "created_at"],
)
_CONSUME = (
    update(pending_inputs)
    .where(pending_inputs.c.input_id.in_(bindparam("b_ids", expanding=True)))
    .values(consumed_at=bindparam("b_now"))
)
_CONSUME_FOR_RUN = _CONSUME.values(run_id=bindparam("b_run"))
_OPEN_ANY = (
    select(pending_inputs)
    .where(
        pending_inputs.c.thread_id == bindparam("b_thread"),
        pending_inputs.c.disposition == bindparam("b_disposition"),
        pending_inputs.c.consumed_at.is_(None),
    )
    .order_by(pending_inputs.c.input_id)
)
_OPEN = Prepared(_OPEN_ANY)
_OPEN_OF_RUN_ANY = _OPEN_ANY.where(pending_inputs.c.run_id == bindparam("b_run"))
_OPEN_OF_RUN = Prepared(_OPEN_OF_RUN_ANY)
