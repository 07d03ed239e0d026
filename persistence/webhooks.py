"""The webhook outbox (docs/protocol.md §10): deliveries stored with the events they announce.

`WebhookPlan.announcer` gives the event log's writer an `Announce` for a batch that holds an
event some endpoint wants; it writes one row per event and endpoint inside the transaction that
stores the events, so a webhook is never sent for an event that was not stored, and a crash
between the commit and the delivery loses nothing. Dispatchers
(gateway/event_log/webhook_dispatch.py) `claim` due rows for a while, deliver them, and settle each:
delivered (deleted), retried later, or given up on (`failed`, kept).

A claim is a conditional UPDATE of rows nobody holds: on PostgreSQL the rows are also locked
(`SKIP LOCKED`), so two processes on one database never claim one row at once; SQLite has one
writer at a time anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any

import orjson
from sqlalchemy import bindparam, case, delete, func, or_, select, update
from sqlalchemy.engine import Connection

from persistence.approvals import ApprovalRepository
from persistence.clock import as_utc, utcnow
from persistence.events import Announce, EventRecord, NewEvent
from persistence.ids import new_id
from persistence.prepared import Prepared
from persistence.tables import threads, webhook_deliveries

if TYPE_CHECKING:
    from persistence.store import Store

APPROVAL_REQUESTED = "approval.requested"
APPROVAL_DECIDED = "approval.decided"
# Not an event of the log: an `approval.decided` with `"expired": true` (the system's reject).
APPROVAL_EXPIRED = "approval.expired"
RUN_COMPLETED = "run.completed"
RUN_FAILED = "run.failed"
RUN_CANCELLED = "run.cancelled"

WEBHOOK_TYPES = (
    APPROVAL_REQUESTED,
    APPROVAL_DECIDED,
    APPROVAL_EXPIRED,
    RUN_COMPLETED,
    RUN_FAILED,
    RUN_CANCELLED,
)
DEFAULT_WEBHOOK_TYPES = (
    APPROVAL_REQUESTED,
    APPROVAL_DECIDED,
    APPROVAL_EXPIRED,
    RUN_COMPLETED,
    RUN_FAILED,
)
# The log's event type each webhook type comes from.
_LOGGED_AS = {APPROVAL_EXPIRED: APPROVAL_DECIDED}


class DeliveryStatus(StrEnum):
    PENDING = "pending"
    FAILED = "failed"


def webhook_type(event_type: str, data: Any) -> str:
    if event_type == APPROVAL_DECIDED and isinstance(data, dict) and data.get("expired"):
        return APPROVAL_EXPIRED
    return event_type


@dataclass(frozen=True)
class WebhookPlan:
    """Which webhook types go to which endpoints (every endpoint gets every type)."""

    endpoints: tuple[str, ...]
    types: frozenset[str]

    @cached_property
    def logged_types(self) -> frozenset[str]:
        return frozenset(_LOGGED_AS.get(t, t) for t in self.types)

    def announcer(self, events: Sequence[NewEvent]) -> Announce | None:
        """The outbox writer for a batch, or None (the streamed batches' case) when none of
        its events can be announced: a set lookup per event, no JSON decoding."""
        logged_types = self.logged_types
        for event in events:
            if event.type in logged_types:
                return partial(enqueue_in, plan=self)
        return None


@dataclass(frozen=True)
class Delivery:
    delivery_id: int
    message_id: str
    endpoint: str
    type: str
    payload: str
    attempts: int  # before this one
    created_at: datetime


_TENANT = Prepared(select(threads.c.tenant).where(threads.c.thread_id == bindparam("b_thread")))
_INSERT = Prepared(
    webhook_deliveries.insert(),
    keys=[
        "message_id",
        "endpoint",
        "type",
        "payload",
        "status",
        "attempts",
        "created_at",
        "next_attempt_at",
    ],
)
_t = webhook_deliveries.c
_UNCLAIMED_DUE = (
    _t.status == DeliveryStatus.PENDING.value,
    _t.next_attempt_at <= bindparam("b_now"),
    or_(_t.claim_expires_at.is_(None), _t.claim_expires_at <= bindparam("b_now")),
)
_DUE = (
    select(_t.delivery_id)
    .where(*_UNCLAIMED_DUE)
    .order_by(_t.next_attempt_at, _t.delivery_id)
    .limit(bindparam("b_limit"))
    .with_for_update(skip_locked=True)
)
# The WHERE again: on PostgreSQL an UPDATE that waited for another's row lock re-checks it.
_CLAIM = (
    update(webhook_deliveries)
    .where(_t.delivery_id.in_(bindparam("b_ids", expanding=True)), *_UNCLAIMED_DUE)
    .values(claimed_by=bindparam("b_owner"), claim_expires_at=bindparam("b_until"))
    .returning(
        _t.delivery_id,
        _t.message_id,
        _t.endpoint,
        _t.type,
        _t.payload,
        _t.attempts,
        _t.created_at,
    )
)
_OURS = (_t.delivery_id == bindparam("b_id"), _t.claimed_by == bindparam("b_owner"))
_DELIVERED = Prepared(delete(webhook_deliveries).where(*_OURS))
_SETTLE = Prepared(
    update(webhook_deliveries)
    .where(*_OURS)
    .values(
        status=bindparam("b_status"),
        attempts=bindparam("b_attempts"),
        next_attempt_at=bindparam("b_next"),
        last_error=bindparam("b_error"),
        claimed_by=None,
        claim_expires_at=None,
    )
)
_RELEASE = Prepared(
    update(webhook_deliveries)
    .where(_t.claimed_by == bindparam("b_owner"))
    .values(claimed_by=None, claim_expires_at=None)
)
# When a row can next be claimed: when it is due, or when its claim runs out if that is later.
_NEXT_DUE = select(
    func.min(
        case(
            (_t.claim_expires_at > _t.next_attempt_at, _t.claim_expires_at),
            else_=_t.next_attempt_at,
        )
    )
).where(_t.status == DeliveryStatus.PENDING.value)
_OF_STATUS = select(_t.message_id, _t.type, _t.attempts, _t.last_error).where(
    _t.status == bindparam("b_status")
)


def enqueue_in(conn: Connection, records: list[EventRecord], plan: WebhookPlan) -> None:
    """One pending delivery per announced event and endpoint, in the events' transaction."""
    rows: list[dict[str, Any]] = []
    now = utcnow()
    tenants: dict[str, str | None] = {}
    for record in records:
        data = orjson.loads(record.data)
        type_ = webhook_type(record.type, data)
        if type_ not in plan.types:
            continue
        if record.thread_id not in tenants:
            found = _TENANT.rows(conn, {"b_thread": record.thread_id})
            tenants[record.thread_id] = found[0][0] if found else None
        if record.type == APPROVAL_DECIDED and isinstance(data, dict):
            data = _with_approval(conn, data)
        message_id = new_id("msg")
        payload = orjson.dumps(
            {
                "id": message_id,
                "type": type_,
                "created_at": record.ts,
                "tenant": tenants[record.thread_id],
                "thread_id": record.thread_id,
                "run_id": record.run_id,
                "seq": record.seq,
                "data": data,
            }
        ).decode()
        for endpoint in plan.endpoints:
            rows.append(
                {
                    "message_id": message_id,
                    "endpoint": endpoint,
                    "type": type_,
                    "payload": payload,
                    "status": DeliveryStatus.PENDING.value,
                    "attempts": 0,
                    "created_at": now,
                    "next_attempt_at": now,
                }
            )
    if rows:
        _INSERT.many(conn, rows)


def _with_approval(conn: Connection, data: dict[str, Any]) -> dict[str, Any]:
    """A decision's event names only the approval: the tool, agent and outcome come from its
    row, just written in this transaction. The arguments stay out: the `approval.requested`
    webhook of the same `approval_id` carried them, masked."""
    approval_id = data.get("approval_id")
    if not isinstance(approval_id, str):
        return data
    approval = ApprovalRepository.get_in(conn, approval_id)
    if approval is None:
        return data
    return {
        **data,
        "tool_name": approval.tool_name,
        "agent": approval.agent,
        "status": approval.status.value,
    }


class WebhookRepository:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def claim(
        self, owner: str, *, hold_s: float, limit: int, now: datetime | None = None
    ) -> list[Delivery]:
        """Due deliveries nobody holds, now held by `owner` for `hold_s` seconds."""
        moment = now or utcnow()

        def work(conn: Connection) -> list[Delivery]:
            ids = list(conn.execute(_DUE, {"b_now": moment, "b_limit": limit}).scalars())
            if not ids:
                return []
            params = {
                "b_ids": ids,
                "b_now": moment,
                "b_owner": owner,
                "b_until": moment + timedelta(seconds=hold_s),
            }
            return [
                Delivery(
                    row.delivery_id,
                    row.message_id,
                    row.endpoint,
                    row.type,
                    row.payload,
                    row.attempts,
                    as_utc(row.created_at) or moment,
                )
                for row in conn.execute(_CLAIM, params)
            ]

        return await self._store.write(work)

    async def delivered(self, delivery: Delivery, owner: str) -> None:
        await self._store.write(
            lambda conn: _DELIVERED.rowcount(conn, {"b_id": delivery.delivery_id, "b_owner": owner})
        )

    async def retry(
        self, delivery: Delivery, owner: str, *, attempts: int, at: datetime, error: str
    ) -> None:
        await self._settle(delivery, owner, DeliveryStatus.PENDING, attempts, at, error)

    async def give_up(self, delivery: Delivery, owner: str, *, attempts: int, error: str) -> None:
        await self._settle(delivery, owner, DeliveryStatus.FAILED, attempts, utcnow(), error)

    async def _settle(
        self,
        delivery: Delivery,
        owner: str,
        status: DeliveryStatus,
        attempts: int,
        at: datetime,
        error: str,
    ) -> None:
        params = {
            "b_id": delivery.delivery_id,
            "b_owner": owner,
            "b_status": status.value,
            "b_attempts": attempts,
            "b_next": at,
            "b_error": error[:256],
        }
        await self._store.write(lambda conn: _SETTLE.rowcount(conn, params))

    async def release(self, owner: str) -> int:
        """Give up `owner`'s claims (a process stopping with attempts in flight): whichever
        process runs next attempts them at once instead of when the claims run out."""
        return await self._store.write(lambda conn: _RELEASE.rowcount(conn, {"b_owner": owner}))

    async def next_due(self) -> datetime | None:
        """When the earliest pending delivery can be claimed (None: nothing pending): a
        dispatcher waits for that instead of asking again and again while another holds it."""
        return as_utc(await self._store.read(lambda conn: conn.execute(_NEXT_DUE).scalar()))

    async def of_status(self, status: DeliveryStatus) -> list[dict[str, Any]]:
        """The deliveries in `status`: message id, type, attempts and last error (operators,
        tests)."""
        return await self._store.read(
            lambda conn: [
                dict(row._mapping) for row in conn.execute(_OF_STATUS, {"b_status": status.value})
            ]
        )
