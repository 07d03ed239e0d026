"""Threads as people see them (docs/protocol.md §8 "Threads"): a title, the newest run's status,
the last activity and the pending approvals of each thread; renaming, archiving and deleting;
and live lists that follow every change, in this process and in the others on the database.

A live list is fed by the bus (`threads_changed`: a thread's run changed status, an approval
waits or was decided, someone renamed, archived or deleted it). Changes are gathered while a
read is under way, so a burst of them costs one read of the changed threads per process,
whatever the number of lists open; each list then gets those of the threads its reader may see.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy.engine import Connection

from gateway.auth.access import AccessDenied, check_can_act_on_thread, check_can_subscribe
from gateway.auth.audit_trail import AuditAction, Outcome, caller_entry
from gateway.protocol.error_codes import ErrorCode, GatewayError, conflict, not_found
from gateway.protocol.frames import utc_ts
from gateway.protocol.identity import Principal, Role
from gateway.run_lifecycle.context import RunContext, thread_ref
from gateway.run_lifecycle.thread_titles import checked_title
from persistence.audit import AuditRepository
from persistence.clock import utcnow
from persistence.errors import StorageUnavailable
from persistence.runs import RunRepository
from persistence.thread_summaries import ThreadSummaries, ThreadSummary
from persistence.threads import HEADS_PER_READ, ThreadRecord, ThreadRepository

log = logging.getLogger(__name__)

MAX_LIST = 500
# After a failed read of changed threads, the next try (the changes are kept meanwhile).
RETRY_S = 1.0

# A list's reader is told the new views of threads it may see and the ids of those that left
# the list (deleted, or archived out of it, or back in for an archive list).
OnUpdate = Callable[[list[dict[str, Any]], list[str]], None]
# A list's reader is told the whole list again (changes may have been missed).
OnSnapshot = Callable[[list[dict[str, Any]]], None]


def thread_view(summary: ThreadSummary) -> dict[str, Any]:
    """A thread as `GET /v1/threads`, `threads` and `threads.update` show it."""
    thread = summary.thread
    return {
        "thread_id": thread.thread_id,
        "owner": thread.owner,
        "created_at": utc_ts(thread.created_at),
        "metadata": thread.metadata,
        "epoch": thread.epoch,
        "head_seq": thread.head_seq,
        "title": thread.title,
        "archived": thread.archived_at is not None,
        "archived_at": utc_ts(thread.archived_at) if thread.archived_at else None,
        "last_activity_at": utc_ts(summary.last_activity_at),
        "run_id": summary.run_id,
        "status": summary.status,
        "pending_approvals": summary.pending_approvals,
    }


def sees_tenant(principal: Principal) -> bool:
    """Reviewers, viewers and admins list every thread of their tenant; users their own."""
    return principal.has_any(Role.REVIEWER, Role.VIEWER, Role.ADMIN)


def check_can_list(principal: Principal) -> None:
    if not sees_tenant(principal) and not principal.has(Role.USER):
        raise GatewayError(ErrorCode.FORBIDDEN, "listing threads needs a role")


def _may_see(principal: Principal, thread: ThreadRecord) -> bool:
    try:
        check_can_subscribe(principal, thread_ref(thread))
    except (AccessDenied, GatewayError):
        return False
    return True


@dataclass(eq=False)
class _Reader:
    principal: Principal
    archived: bool
    on_update: OnUpdate
    on_snapshot: OnSnapshot


class ThreadList:
    def __init__(self, ctx: RunContext) -> None:
        self._ctx = ctx
        self._summaries = ThreadSummaries(ctx.store)
        self._readers: set[_Reader] = set()
        self._unsubscribe: Callable[[], None] | None = None
        # Threads changed since the last read (None: every list is to be read again).
        self._changed: set[str] = set()
        self._resync = False
        self._reading: asyncio.Task[None] | None = None

    # -- reads ---------------------------------------------------------------------------

    async def views(
        self, principal: Principal, *, archived: bool | None = False, limit: int = 100
    ) -> list[dict[str, Any]]:
        """The threads `principal` may list, newest first (`archived`: see `list_for`)."""
        check_can_list(principal)
        records = await self._ctx.threads.list_for(
            tenant=principal.tenant,
            owner=None if sees_tenant(principal) else principal.user,
            limit=limit,
            archived=archived,
        )
        return [thread_view(summary) for summary in await self._summaries.of(records)]

    async def view(self, principal: Principal, thread_id: str) -> dict[str, Any]:
        """One thread's view, for whoever may watch it."""
        thread = await self._ctx.thread_for(principal, thread_id)
        check_can_subscribe(principal, thread_ref(thread))
        (summary,) = await self._summaries.of([thread])
        return thread_view(summary)

    # -- changes -------------------------------------------------------------------------

    async def change(
        self,
        principal: Principal,
        thread_id: str,
        *,
        title: object = None,
        archived: object = None,
    ) -> dict[str, Any]:
        """Rename and/or archive (or bring back) a thread: its owner or an admin. Audited in
        the same transaction; every live list hears of it."""
        if title is None and archived is None:
            raise GatewayError(ErrorCode.BAD_REQUEST, "give a title, archived, or both")
        if archived is not None and not isinstance(archived, bool):
            raise GatewayError(ErrorCode.BAD_REQUEST, "archived must be true or false")
        new_title = checked_title(title) if title is not None else None
        thread = await self._ctx.thread_for(principal, thread_id)
        check_can_act_on_thread(principal, thread_ref(thread))
        values: dict[str, Any] = {}
        entries = []
        if new_title is not None and new_title != thread.title:
            values["title"] = new_title
            entries.append(self._entry(principal, AuditAction.THREAD_RENAMED, thread))
        if archived is not None and archived != (thread.archived_at is not None):
            values["archived_at"] = utcnow() if archived else None
            action = AuditAction.THREAD_ARCHIVED if archived else AuditAction.THREAD_UNARCHIVED
            entries.append(self._entry(principal, action, thread))
        if values:
            changed = await self._ctx.store.write(
                partial(_change_in, thread_id=thread_id, values=values, entries=entries)
            )
            if changed is None:
                raise not_found("thread not found")
            self._ctx.bus.threads_changed([thread_id])
            if self._ctx.metrics is not None:
                for entry in entries:
                    self._ctx.metrics.thread_changed(entry.action.removeprefix("thread."))
        return await self.view(principal, thread_id)

    async def delete(self, principal: Principal, thread_id: str) -> dict[str, Any]:
        """Delete a thread with no active run: its owner or an admin (see
        `ThreadRepository.delete_in` for what goes and what stays). Audited in the same
        transaction; every live list hears of it."""
        thread = await self._ctx.thread_for(principal, thread_id)
        check_can_act_on_thread(principal, thread_ref(thread))
        entry = self._entry(principal, AuditAction.THREAD_DELETED, thread)
        async with self._ctx.lock(thread_id):
            deleted = await self._ctx.store.write(
                partial(_delete_in, thread_id=thread_id, entry=entry), slow=True
            )
        if not deleted:
            raise not_found("thread not found")
        self._ctx.bus.threads_changed([thread_id])
        if self._ctx.metrics is not None:
            self._ctx.metrics.thread_changed("deleted")
        return {"thread_id": thread_id, "deleted": True}

    @staticmethod
    def _entry(principal: Principal, action: str, thread: ThreadRecord) -> Any:
        # Titles are what people wrote: the trail records who changed what, not the words.
        return caller_entry(
            principal,
            action,
            outcome=Outcome.SUCCESS,
            target=thread.thread_id,
            details={"owner": thread.owner},
        )

    # -- live lists ----------------------------------------------------------------------

    async def watch(
        self,
        principal: Principal,
        *,
        archived: bool,
        on_update: OnUpdate,
        on_snapshot: OnSnapshot,
    ) -> tuple[list[dict[str, Any]], Callable[[], None]]:
        """The list as it is, and a live subscription to its changes (call the second item to
        end it). Subscribed before the list is read: a change that lands meanwhile is sent
        after the list, never lost."""
        check_can_list(principal)
        reader = _Reader(principal, archived, on_update, on_snapshot)
        self._readers.add(reader)
        metrics = self._ctx.metrics
        if metrics is not None:
            metrics.thread_lists.inc()
        if self._unsubscribe is None:
            self._unsubscribe = self._ctx.bus.subscribe_thread_changes(self._heard)

        def stop() -> None:
            if reader not in self._readers:
                return
            self._readers.discard(reader)
            if metrics is not None:
                metrics.thread_lists.dec()
            if not self._readers and self._unsubscribe is not None:
                self._unsubscribe()
                self._unsubscribe = None

        try:
            snapshot = await self.views(principal, archived=archived, limit=MAX_LIST)
        except BaseException:
            stop()
            raise
        return snapshot, stop

    def _heard(self, thread_ids: Sequence[str] | None) -> None:
        if thread_ids is None:
            self._resync = True
        else:
            self._changed.update(thread_ids)
        if len(self._changed) > HEADS_PER_READ:
            # Too many to read at once: every list is read again instead.
            self._changed.clear()
            self._resync = True
        if self._reading is None or self._reading.done():
            self._reading = self._ctx.spawn(self._read_changes(), "thread-list")

    async def _read_changes(self) -> None:
        while (self._changed or self._resync) and self._readers:
            changed, self._changed = self._changed, set()
            resync, self._resync = self._resync, False
            try:
                if resync:
                    await self._send_snapshots()
                else:
                    await self._send_changes(changed)
            except StorageUnavailable:
                log.warning("thread lists: storage unavailable; trying again")
                self._changed |= changed
                self._resync = self._resync or resync
                await asyncio.sleep(RETRY_S)
            except Exception:
                # Not this read's changes alone: every list is read again on the next change.
                log.error("thread lists: reading changed threads failed", exc_info=True)
                self._resync = True
                await asyncio.sleep(RETRY_S)
        self._changed.clear()

    async def _send_changes(self, changed: set[str]) -> None:
        records = await self._ctx.threads.get_many(sorted(changed))
        live = [record for record in records if record.deleted_at is None]
        summaries = {s.thread.thread_id: s for s in await self._summaries.of(live)}
        for reader in list(self._readers):
            views, removed = [], []
            for record in records:
                if not _may_see(reader.principal, record):
                    continue
                summary = summaries.get(record.thread_id)
                if summary is None or (record.archived_at is not None) != reader.archived:
                    removed.append(record.thread_id)
                else:
                    views.append(thread_view(summary))
            if views or removed:
                reader.on_update(views, removed)

    async def _send_snapshots(self) -> None:
        for reader in list(self._readers):
            reader.on_snapshot(
                await self.views(reader.principal, archived=reader.archived, limit=MAX_LIST)
            )


def _change_in(
    conn: Connection, thread_id: str, values: dict[str, Any], entries: list[Any]
) -> datetime | None:
    changed = ThreadRepository.change_in(conn, thread_id, values)
    if changed and entries:
        AuditRepository.insert_in(conn, entries)
    return utcnow() if changed else None


def _delete_in(conn: Connection, thread_id: str, entry: Any) -> bool:
    if RunRepository.active_for_thread_in(conn, thread_id) is not None:
        raise conflict("the thread has an active run; cancel it before deleting the thread")
    if not ThreadRepository.delete_in(conn, thread_id):
        return False
    AuditRepository.insert_in(conn, entry)
    return True
