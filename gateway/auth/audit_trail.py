"""The audit trail service: what is recorded, and how each kind of entry is written.

Two paths, on purpose:

- Decisions and cancellations are recorded in the same transaction as the state change they
  describe (`decision_entry`, `cancellation_entry` + `AuditRepository.insert_in`), so the trail
  can never disagree with what happened.
- Token failures and access denials cost the caller nothing: they go into a bounded in-memory
  queue drained by one background writer (`note`). Anyone can send those requests, so a flood
  of them must not turn into a flood of transactions; when the queue is full entries are dropped
  and counted, and the count is logged.

Entries never hold a token, a secret or tool arguments: a token failure records only its
reason category, a decision only the arguments' digest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from enum import StrEnum
from typing import Any

from gateway.protocol.identity import Principal
from persistence.audit import AuditEntry, AuditRecord, AuditRepository

# Re-exported: also what the reviewer API builds, so that it need not import persistence.
from persistence.audit import AuditQuery as AuditQuery
from persistence.errors import StorageUnavailable
from persistence.store import Store

log = logging.getLogger(__name__)

SYSTEM_ACTOR = "system"
MAX_BATCH = 256
DEFAULT_MAX_QUEUED = 10_000


# Refusals of an authenticated caller that the trail records as `access.denied`.
DENIAL_CODES = frozenset({"forbidden", "not_found"})


class AuditAction(StrEnum):
    APPROVAL_DECIDED = "approval.decided"
    APPROVAL_EXPIRED = "approval.expired"
    RUN_CANCELLED = "run.cancelled"
    RUN_REGENERATED = "run.regenerated"
    RUN_RETRIED = "run.retried"
    TOKEN_REJECTED = "auth.token_rejected"
    ACCESS_DENIED = "access.denied"
    THREAD_RENAMED = "thread.renamed"
    THREAD_ARCHIVED = "thread.archived"
    THREAD_UNARCHIVED = "thread.unarchived"
    THREAD_DELETED = "thread.deleted"


class Outcome(StrEnum):
    SUCCESS = "success"
    # The request was refused: a bad token, or an authenticated caller without access.
    DENIED = "denied"
    # The action was accepted but did not take effect (a cancel that lost to the run's end).
    FAILED = "failed"


class Transport(StrEnum):
    WS = "ws"
    HTTP = "http"


# The verifier's messages, reduced to a category. Messages never hold the token, but they are
# worded for people and may change; the trail keeps a stable, filterable vocabulary instead.
_TOKEN_REASONS: tuple[tuple[str, str], ...] = (
    ("expired", "expired"),
    ("not valid yet", "not_yet_valid"),
    ("signature", "bad_signature"),
    ("algorithm", "bad_algorithm"),
    ("key id", "unknown_key"),
    ("issuer", "bad_issuer"),
    ("audience", "bad_audience"),
    ("unknown role", "unknown_role"),
    # Before "missing": "token is missing the 'exp' claim" is a claim problem, not no token.
    ("claim", "bad_claim"),
    ("too long", "too_long"),
    ("missing", "missing"),
)


def token_failure_reason(message: str) -> str:
    text = message.lower()
    for needle, reason in _TOKEN_REASONS:
        if needle in text:
            return reason
    return "invalid"


def caller_entry(
    principal: Principal,
    action: str,
    *,
    outcome: Outcome,
    target: str | None,
    details: dict[str, Any],
) -> AuditEntry:
    """An action an authenticated caller took or tried: the tenant, the actor and the source
    all come from its principal, never from the request."""
    return AuditEntry(
        action=action,
        outcome=outcome,
        tenant=principal.tenant,
        actor=principal.user,
        target=target,
        source=principal.source,
        details=details,
    )


def decision_entry(
    principal: Principal,
    *,
    approval_id: str,
    decision: str,
    run_id: str,
    thread_id: str,
    tool_name: str,
    arguments_digest: str,
    has_reason: bool,
    edited_arguments_digest: str | None = None,
) -> AuditEntry:
    details = {
        "decision": decision,
        "run_id": run_id,
        "thread_id": thread_id,
        "tool_name": tool_name,
        # What was approved, provably, without repeating possibly sensitive arguments.
        "arguments_digest": arguments_digest,
        "reason_given": has_reason,
    }
    if edited_arguments_digest is not None:
        # Approved with edited arguments: what the tool ran with, the same way.
        details["edited_arguments_digest"] = edited_arguments_digest
    return caller_entry(
        principal,
        AuditAction.APPROVAL_DECIDED,
        outcome=Outcome.SUCCESS,
        target=approval_id,
        details=details,
    )


def rule_decision_entry(
    *,
    tenant: str,
    approval_id: str,
    decision: str,
    rule: str,
    run_id: str,
    thread_id: str,
    tool_name: str,
    arguments_digest: str,
) -> AuditEntry:
    """A call a graph's approval rule decided by itself: actor `system`, the rule named."""
    return system_entry(
        AuditAction.APPROVAL_DECIDED,
        tenant=tenant,
        target=approval_id,
        details={
            "decision": decision,
            "rule": rule,
            "run_id": run_id,
            "thread_id": thread_id,
            "tool_name": tool_name,
            "arguments_digest": arguments_digest,
        },
    )


def cancellation_entry(
    principal: Principal,
    *,
    run_id: str,
    thread_id: str,
    status: str,
    outcome: Outcome = Outcome.SUCCESS,
) -> AuditEntry:
    """`status` is the run's status when the cancel was asked for (or how it ended instead)."""
    return caller_entry(
        principal,
        AuditAction.RUN_CANCELLED,
        outcome=outcome,
        target=run_id,
        details={"thread_id": thread_id, "status": status},
    )


def answered_again_entry(
    principal: Principal,
    *,
    run_id: str,
    thread_id: str,
    supersedes: str | None = None,
    retries: str | None = None,
) -> AuditEntry:
    """A run that answers again: a regenerate (`supersedes`) or a retry (`retries`)."""
    details: dict[str, str | None]
    if retries is not None:
        action, details = AuditAction.RUN_RETRIED, {"thread_id": thread_id, "retries": retries}
    else:
        action, details = (
            AuditAction.RUN_REGENERATED,
            {"thread_id": thread_id, "supersedes": supersedes},
        )
    return caller_entry(principal, action, outcome=Outcome.SUCCESS, target=run_id, details=details)


def system_entry(
    action: str,
    *,
    tenant: str | None,
    target: str | None,
    details: dict[str, Any] | None = None,
    outcome: Outcome = Outcome.SUCCESS,
) -> AuditEntry:
    """An action the gateway takes by itself (for example expiring an approval)."""
    return AuditEntry(
        action=action,
        outcome=outcome,
        tenant=tenant,
        actor=SYSTEM_ACTOR,
        target=target,
        source=None,
        details=dict(details or {}),
    )


class AuditTrail:
    """Created in the app lifespan; `start` before serving, `close` after the last request."""

    def __init__(self, store: Store, *, max_queued: int = DEFAULT_MAX_QUEUED) -> None:
        self.repository = AuditRepository(store)
        self._queue: asyncio.Queue[AuditEntry] = asyncio.Queue(max_queued)
        self._task: asyncio.Task[None] | None = None
        self._dropped = 0  # since the last report
        self.dropped_total = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._writer(), name="audit-writer")

    async def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (within `timeout_s`), then stop the writer."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout_s)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        self._report_dropped()

    # -- recording ---------------------------------------------------------------------------

    def note(self, entry: AuditEntry) -> None:
        """Queue an entry for the background writer; never waits, drops (and counts) when full."""
        try:
            self._queue.put_nowait(entry)
        except asyncio.QueueFull:
            self._dropped += 1
            self.dropped_total += 1

    async def record(self, entry: AuditEntry) -> None:
        """Write one entry now, in its own transaction.

        An entry for a state change (`system_entry` for the gateway's own, such as an expired
        approval) goes with `AuditRepository.insert_in` into that change's transaction instead.
        """
        await self.repository.insert(entry)

    def token_rejected(self, *, source: str | None, transport: Transport, message: str) -> None:
        """A token that failed verification: only the reason category, never the token."""
        self.note(
            AuditEntry(
                action=AuditAction.TOKEN_REJECTED,
                outcome=Outcome.DENIED,
                source=source,
                details={"transport": transport.value, "reason": token_failure_reason(message)},
            )
        )

    def access_denied(
        self,
        principal: Principal,
        *,
        code: str,
        operation: str,
        target: str | None,
        transport: Transport,
    ) -> None:
        """An authenticated caller was refused (`forbidden`, or `not_found` for ids it may not
        see): who, which operation, which id."""
        self.note(
            caller_entry(
                principal,
                AuditAction.ACCESS_DENIED,
                outcome=Outcome.DENIED,
                target=target,
                details={"code": code, "operation": operation, "transport": transport.value},
            )
        )

    async def list_entries(self, query: AuditQuery) -> tuple[list[AuditRecord], int | None]:
        return await self.repository.list_entries(query)

    # -- the background writer ---------------------------------------------------------------

    async def _writer(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self.repository.insert(batch)
            except StorageUnavailable:
                # Best effort by design: these entries must never hold up or fail a request.
                self._dropped += len(batch)
                self.dropped_total += len(batch)
                log.warning("audit entries not written: storage unavailable")
            except Exception:
                self._dropped += len(batch)
                self.dropped_total += len(batch)
                log.error("audit entries not written", exc_info=True)
            finally:
                for _ in batch:
                    self._queue.task_done()
            self._report_dropped()

    def _report_dropped(self) -> None:
        # Reported by the writer, not at each drop: a flood would otherwise flood the log too.
        if self._dropped:
            log.warning(
                "audit trail dropped %d entries (queue full or storage unavailable; %d in total)",
                self._dropped,
                self.dropped_total,
            )
            self._dropped = 0
