"""Deciding approvals: who may, whether the approval can still be decided, and expiry.

A decision is recorded only on a pending approval of the run's current checkpoint, by a
reviewer the access table and the review rules allow (gateway/run_lifecycle/review_rules.py), for
the call the approval displayed (gateway/run_lifecycle/approval_binding.py). It is a
compare-and-swap stored in the same transaction as `approval.decided` and its audit entry, under the
thread's lock, and acknowledged as soon as it is stored: the continuation it completes runs as a
background task (gateway/run_lifecycle/continuation.py). With GATEWAY_APPROVAL_TTL_S, approvals left
undecided past `expires_at` are rejected by the system the same way.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import datetime
from typing import Any, NamedTuple

from agents.run_state import RunState
from sqlalchemy.engine import Connection

from gateway.agents.edited_arguments import checked_edit
from gateway.auth.access import AccessDenied
from gateway.auth.audit_trail import AuditAction, decision_entry, system_entry
from gateway.protocol.error_codes import ErrorCode, GatewayError, conflict, not_found
from gateway.protocol.frames import EventType, utc_ts
from gateway.protocol.identity import Principal
from gateway.run_lifecycle.approval_binding import arguments_digest, binding_problem, by_call_id
from gateway.run_lifecycle.context import RunContext, thread_ref
from gateway.run_lifecycle.continuation import (
    Continued,
    Continuer,
    Pause,
    PauseInputs,
)
from gateway.run_lifecycle.review_rules import check_decider, review_context
from gateway.run_lifecycle.sensitive_arguments import masked_call_data
from gateway.storage.health import log_failure
from persistence.approvals import ApprovalRecord, ApprovalRepository, ApprovalStatus
from persistence.audit import AuditRepository
from persistence.clock import utcnow
from persistence.errors import StaleWrite, StorageUnavailable
from persistence.events import WithEvents
from persistence.run_status import RunStatus
from persistence.runs import RunRecord
from persistence.threads import ThreadRecord

log = logging.getLogger(__name__)


def approval_window_s(approval: ApprovalRecord) -> float:
    """How long the approval could be decided (stored, so a changed TTL does not rewrite it)."""
    if approval.expires_at is None:
        return 0.0
    return round((approval.expires_at - approval.requested_at).total_seconds(), 3)


def expiry_phrase(approval: ApprovalRecord) -> str:
    seconds = approval_window_s(approval)
    unit = "second" if seconds == 1 else "seconds"
    return f"expired after {seconds:g} {unit} without a decision"


def expiry_reason(approval: ApprovalRecord) -> str:
    """What the model is told instead of the tool's output when nobody decided in time."""
    return f"The approval request {expiry_phrase(approval)}."


def settled_message(approval: ApprovalRecord) -> str:
    """Why a decision on an approval that is no longer pending is refused (`conflict`)."""
    if approval.status is ApprovalStatus.EXPIRED:
        return f"approval {expiry_phrase(approval)}"
    if approval.status is ApprovalStatus.SUPERSEDED:
        detail = approval.reason or "the run moved on or was cancelled"
        return f"approval was superseded: {detail}"
    return f"approval already {approval.status.value}"


class Recorded(NamedTuple):
    """What a decision's transaction read and did after recording it."""

    # the pause's approvals and staged input, as read after the decision's own write
    known: PauseInputs
    # whether it claimed the continuation (nothing was left pending)
    claimed: bool
    # the continuation, when the transaction started it as well
    continued: Continued | None


class Decisions:
    def __init__(
        self,
        ctx: RunContext,
        continuer: Continuer,
        *,
        self_approval: bool,
        four_eyes: bool,
        approval_ttl_s: float,
        approval_sweep_s: float,
    ) -> None:
        self._ctx = ctx
        self._continuer = continuer
        self._self_approval = self_approval
        self._four_eyes = four_eyes
        self._approval_ttl_s = approval_ttl_s
        self._approval_sweep_s = approval_sweep_s

    def may_approve(
        self, principal: Principal, thread: ThreadRecord, run: RunRecord, tool_name: str
    ) -> bool:
        """Whether `principal` may approve `run`'s calls of `tool_name` (and so decide them
        either way): who decides the tool (`decided_by`), the access table, the tool's reviewer
        roles and four-eyes together. The frontend adapters ask it to know whether a pause is
        their caller's to decide."""
        try:
            review = review_context(
                run, tool_name, self._ctx.graph(run.agent), self_approval=self._self_approval
            )
            check_decider(
                principal,
                thread_ref(thread),
                tool_name,
                review,
                "approve",
                four_eyes=self._four_eyes,
            )
        except (AccessDenied, GatewayError):
            return False
        return True

    async def vet(
        self,
        principal: Principal,
        approval_id: str,
        decision: str,
        arguments: dict[str, Any] | None = None,
        *,
        thread_id: str | None = None,
    ) -> ApprovalRecord:
        """Refuse, recording nothing of it, a decision `decide` would refuse for who is
        asking, for the approval's state or for its edited `arguments`: several decisions sent
        together are all vetted before the first is recorded. (`decide` checks everything again
        under the thread's lock.) An approval found past its `expires_at` is expired on the
        way, as `decide` expires it. `thread_id`: the conversation the decision was sent to; an
        approval of another is not found there, before anything about it is told."""
        approval, run, _ = await self._read_request(
            principal, approval_id, decision, arguments, thread_id=thread_id
        )
        if approval.status is not ApprovalStatus.PENDING:
            raise conflict(settled_message(approval))
        if run.checkpoint_version != approval.checkpoint_version or run.status.terminal:
            raise conflict("approval was superseded: the run has moved on")
        if approval.expires_at is not None and utcnow() >= approval.expires_at:
            # Expired now, as `decide` and the sweep expire it: the refusal changes nothing,
            # but what it found is settled, so that nobody waits for the sweep to learn it.
            await self._settle_due(approval)
            raise conflict(f"approval {expiry_phrase(approval)}")
        return approval

    async def vet_repeat(
        self,
        principal: Principal,
        approval_id: str,
        decision: str,
        reason: str | None,
        arguments: dict[str, Any] | None = None,
        *,
        abandoned: bool = False,
    ) -> ApprovalRecord:
        """An answer sent again for an approval already settled: refused (`conflict`,
        changing nothing) unless it is the stored decision, the same verdict with the same
        reason and edited `arguments`; an answer that abandons the call (`abandoned`) also
        repeats its expiry. What `vet` would refuse of the answer itself is refused first."""
        approval, _, _ = await self._read_request(principal, approval_id, decision, arguments)
        if abandoned and approval.status is ApprovalStatus.EXPIRED:
            return approval
        status = ApprovalStatus.of_verdict(decision)
        if approval.status is not status:
            raise conflict(settled_message(approval))
        if approval.edited_arguments != arguments:
            raise conflict(f"approval already {status.value}, with other edited arguments")
        if approval.reason != reason:
            raise conflict(f"approval already {status.value}, with another reason")
        return approval

    async def decide(
        self,
        principal: Principal,
        approval_id: str,
        decision: str,
        reason: str | None,
        arguments: dict[str, Any] | None = None,
    ) -> ApprovalRecord:
        """`arguments`: an approval with edited arguments, for a tool the graph lets
        reviewers edit (gateway/agents/edited_arguments.py); checked against the tool's JSON
        schema before anything is recorded."""
        ctx = self._ctx
        thread_id = ctx.approval_thread(approval_id)
        if thread_id is None:
            # Read to know which thread's lock to take, refusing what can be refused before.
            _, _, thread = await self._read_request(principal, approval_id, decision, arguments)
            thread_id = thread.thread_id
        async with ctx.lock(thread_id):
            # Read (again) under the lock: a decision or an expiry may have landed meanwhile.
            approval, run, thread = await self._read_request(
                principal, approval_id, decision, arguments
            )
            approval, pause = await self._check_decidable(run, approval)
            status = ApprovalStatus.of_verdict(decision)
            now = utcnow()

            entry = decision_entry(
                principal,
                approval_id=approval_id,
                decision=decision,
                run_id=run.run_id,
                thread_id=run.thread_id,
                tool_name=approval.tool_name,
                arguments_digest=approval.arguments_digest,
                has_reason=bool(reason),
                edited_arguments_digest=(
                    arguments_digest(approval.tool_name, arguments)
                    if arguments is not None
                    else None
                ),
            )
            version = run.checkpoint_version

            # Each also reads what a continuation needs, after its own write: of concurrent
            # deciders, the last to commit sees every decision, claims the continuation and
            # continues the run.
            def record(conn: Connection) -> Recorded | WithEvents:
                if not ApprovalRepository.decide_in(
                    conn,
                    approval_id,
                    status=status,
                    reviewer=principal.user,
                    reason=reason,
                    checkpoint_version=version,
                    decided_at=now,
                    edited_arguments=arguments,
                    # Same transaction: the trail holds exactly the decisions that took effect.
                    audit=entry,
                ):
                    raise StaleWrite(approval_id)
                recorded = Recorded(*self._continuer.claim_after_decision_in(conn, run, start))
                return recorded if recorded.continued is None else WithEvents(recorded, resumed)

            event = ctx.log.new_event(
                run.thread_id,
                run.run_id,
                EventType.APPROVAL_DECIDED,
                {
                    "approval_id": approval_id,
                    "decision": decision,
                    "reason": reason,
                    "reviewer": principal.user,
                    "decided_at": utc_ts(now),
                    **self._edit_data(run, approval, arguments),
                },
            )
            # Made before the decision is recorded, so that if it leaves nothing pending its
            # transaction starts the continuation too: one transaction (and WAL flush) fewer
            # before `run.resumed`.
            start = self._continuer.prepare_after_decision(run, pause, principal.user)
            resumed = (
                [start.announcement(ctx.log, EventType.RUN_RESUMED)] if start is not None else []
            )
            try:
                recorded, _ = await ctx.log.commit([event], record, agent=run.agent)
            except StaleWrite:
                raise conflict("approval was already decided") from None
            if ctx.metrics is not None:
                ctx.metrics.reviewed((now - approval.requested_at).total_seconds())
            ctx.bus.publish_inbox(run.tenant, removed=[approval_id])
            self._waited(approval, decision, now)
            # Exactly the row the compare-and-swap wrote, without reading it back.
            decided = replace(
                approval,
                status=status,
                reviewer=principal.user,
                reason=reason,
                decided_at=now,
                edited_arguments=arguments,
            )
            if recorded.continued is not None:
                assert start is not None
                self._continuer.launch_after_decision(start, recorded.continued)
                return decided
        # The decision is durable; the reviewer's ack need not wait for the restore.
        self._continue_soon(run, recorded.known, claimed=recorded.claimed)
        return decided

    async def _read_request(
        self,
        principal: Principal,
        approval_id: str,
        decision: str,
        arguments: dict[str, Any] | None,
        *,
        thread_id: str | None = None,
    ) -> tuple[ApprovalRecord, RunRecord, ThreadRecord]:
        """The approval a decision names, its run and its thread, read as `principal` may
        see them (`not_found` in another tenant, or outside conversation `thread_id` when
        given), once `_check_request` has passed the decision."""
        approval, run, thread = await self._ctx.approval_for(principal, approval_id)
        if thread_id is not None and approval.thread_id != thread_id:
            raise not_found("approval not found in this conversation")
        self._check_request(principal, approval, run, thread, decision, arguments)
        return approval, run, thread

    def _check_request(
        self,
        principal: Principal,
        approval: ApprovalRecord,
        run: RunRecord,
        thread: ThreadRecord,
        decision: str,
        arguments: dict[str, Any] | None,
    ) -> None:
        """Whether `principal` may make this decision, with these edited `arguments`
        (`AccessDenied`, `bad_request`): nothing is recorded before it passes."""
        self._check_review_rules(principal, thread, run, approval, decision)
        if arguments is not None:
            self._check_edit(run, approval, decision, arguments)

    def _check_edit(
        self, run: RunRecord, approval: ApprovalRecord, decision: str, arguments: Any
    ) -> None:
        """Edited arguments the call may run with, else `bad_request` (nothing recorded)."""
        if decision != "approve":
            raise GatewayError(ErrorCode.BAD_REQUEST, "edited arguments go with an approval")
        graph = self._ctx.graph(run.agent)
        if approval.tool_name not in graph.editable_arguments:
            raise GatewayError(
                ErrorCode.BAD_REQUEST,
                f"tool {approval.tool_name!r} does not take edited arguments",
            )
        # Refused: `EditRefused`, a `bad_request`.
        checked_edit(self._ctx.agent(graph), approval.tool_name, arguments)

    def _edit_data(
        self, run: RunRecord, approval: ApprovalRecord, arguments: dict[str, Any] | None
    ) -> dict[str, Any]:
        """`approval.decided`'s `edited_arguments`, masked in the log as the call's are."""
        if arguments is None:
            return {}
        sensitive = self._ctx.graph(run.agent).sensitive_arguments
        view = masked_call_data({"arguments": arguments}, approval.tool_name, sensitive)
        return {"edited_arguments": view["arguments"]}

    def _waited(self, approval: ApprovalRecord, outcome: str, decided_at: datetime) -> None:
        """The wait for a review, as a span from the request to the stored decision."""
        self._ctx.segments.telemetry.record(
            "gateway.approval.wait",
            approval.requested_at,
            decided_at,
            {
                "gateway.approval.id": approval.approval_id,
                "gateway.thread.id": approval.thread_id,
                "gateway.run.id": approval.run_id,
                "gen_ai.tool.name": approval.tool_name,
                "gateway.approval.outcome": outcome,
            },
        )

    def _continue_soon(
        self, run: RunRecord, known: PauseInputs | None = None, *, claimed: bool = False
    ) -> None:
        self._ctx.spawn(
            self._continuer.continue_when_decided(run, known, claimed=claimed),
            name=f"continue-{run.run_id}",
        )

    def _check_review_rules(
        self,
        principal: Principal,
        thread: ThreadRecord,
        run: RunRecord,
        approval: ApprovalRecord,
        decision: str,
    ) -> None:
        """Who decides the tool, the access table, per-tool reviewer roles and four-eyes
        (gateway/run_lifecycle/review_rules.py): AccessDenied."""
        review = review_context(
            run, approval.tool_name, self._ctx.graph(run.agent), self_approval=self._self_approval
        )
        check_decider(
            principal,
            thread_ref(thread),
            approval.tool_name,
            review,
            decision,
            four_eyes=self._four_eyes,
        )

    async def _check_decidable(
        self, run: RunRecord, approval: ApprovalRecord | None
    ) -> tuple[ApprovalRecord, Pause]:
        """The approval (as just read under the thread lock), if a decision may be recorded on
        it now (caller holds the thread lock), with the pause it belongs to as restored for
        the binding check.

        Otherwise raises `conflict`, after settling what the refusal found: an approval left
        pending by a run that moved on, or whose call in the checkpoint is not the one that
        was displayed (gateway/run_lifecycle/approval_binding.py), is marked superseded; one past
        its `expires_at` is expired exactly as the sweeper would have done.
        """
        ctx = self._ctx
        if approval is None:
            raise not_found("approval not found")
        approval_id = approval.approval_id
        if approval.status is not ApprovalStatus.PENDING:
            raise conflict(settled_message(approval))
        if run.status.terminal or run.checkpoint_version != approval.checkpoint_version:
            await self._supersede(run, [approval_id], "the run moved on before a decision")
            raise conflict("approval was superseded: the run has moved on")
        if run.status is not RunStatus.WAITING_FOR_REVIEW:
            raise conflict("approval was superseded: the run has moved on")
        if approval.expires_at is not None and utcnow() >= approval.expires_at:
            await self._expire_locked(run, approval)
            raise conflict(f"approval {expiry_phrase(approval)}")
        # The pause's checkpoint, usually restored in advance
        # (gateway/run_lifecycle/restored_checkpoints.py).
        checkpoint = ctx.restored.checkpoint(
            run.run_id, run.checkpoint_version
        ) or await ctx.checkpoints.latest(run.run_id)
        if checkpoint is None:
            raise conflict("the run has no checkpoint")
        # Refuse before recording anything: a decision on a run that cannot be restored
        # would otherwise leave it stuck half-decided.
        graph = ctx.graph_for_checkpoint(run, checkpoint)
        state: RunState[Any, Any] | None = None
        problem: str | None = "the run's checkpoint is not the one the approval was requested at"
        if checkpoint.version == approval.checkpoint_version:
            # The restore is kept for the next decision and the continuation, which reuse it.
            state = await ctx.restored.peek(checkpoint, graph)
            calls = by_call_id(state.get_interruptions())
            problem = binding_problem(approval, calls.get(approval.call_id))
        if state is None or problem is not None:
            log.warning("approval %s refused and superseded: %s", approval_id, problem)
            await self._supersede(run, [approval_id], f"not bound to its call: {problem}")
            # Without it the pause may be fully decided: the continuation then meets the
            # call again, undecided, and the SDK asks anew, so a fresh approval shows the
            # call as it really is.
            self._continue_soon(run)
            raise conflict(f"approval was superseded: {problem}")
        return approval, Pause(checkpoint, graph, state, calls)

    async def _supersede(self, run: RunRecord, approval_ids: list[str], reason: str) -> None:
        removed: list[str] = []

        def mark(conn: Connection) -> None:
            removed.extend(ApprovalRepository.supersede_in(conn, approval_ids, reason=reason))

        await self._ctx.log.commit((), mark)
        if removed:
            self._ctx.bus.publish_inbox(run.tenant, removed=removed)

    # -- expiry (GATEWAY_APPROVAL_TTL_S) -------------------------------------------------

    async def _expire_locked(self, run: RunRecord, approval: ApprovalRecord) -> bool:
        """Reject an approval past its `expires_at` on behalf of the system (caller holds the
        thread lock); the run then continues as after a reject. False if it was settled first.
        """
        ctx = self._ctx
        now = utcnow()
        reason = expiry_reason(approval)

        def record(conn: Connection) -> None:
            if not ApprovalRepository.expire_in(
                conn,
                approval.approval_id,
                reason=reason,
                checkpoint_version=approval.checkpoint_version,
                decided_at=now,
            ):
                raise StaleWrite(approval.approval_id)
            # Same transaction as the expiry, like a reviewer's decision.
            AuditRepository.insert_in(
                conn,
                system_entry(
                    AuditAction.APPROVAL_EXPIRED,
                    tenant=run.tenant,
                    target=approval.approval_id,
                    details={
                        "run_id": run.run_id,
                        "thread_id": run.thread_id,
                        "tool_name": approval.tool_name,
                        "arguments_digest": approval.arguments_digest,
                        "ttl_s": approval_window_s(approval),
                    },
                ),
            )

        event = ctx.log.new_event(
            run.thread_id,
            run.run_id,
            EventType.APPROVAL_DECIDED,
            {
                "approval_id": approval.approval_id,
                "decision": "reject",
                "reason": reason,
                "reviewer": None,
                "decided_at": utc_ts(now),
                "expired": True,
            },
        )
        try:
            await ctx.log.commit([event], record)
        except StaleWrite:
            return False
        log.info("approval %s of run %s expired", approval.approval_id, run.run_id)
        self._waited(approval, "expired", now)
        ctx.bus.publish_inbox(run.tenant, removed=[approval.approval_id])
        self._continue_soon(run)
        return True

    async def expire_due(self) -> int:
        """Expire every pending approval past its `expires_at`; returns how many expired.

        Approvals of runs that moved on meanwhile are superseded instead: nobody can decide
        them any more, so nothing is rejected on anyone's behalf.
        """
        expired = 0
        for due in await self._ctx.approvals.expired_pending(utcnow()):
            try:
                expired += await self._settle_due(due)
            except StorageUnavailable:
                raise
            except Exception:
                log.error("expiring approval %s failed", due.approval_id, exc_info=True)
        return expired

    async def _settle_due(self, due: ApprovalRecord) -> bool:
        """Expire an approval past its `expires_at` (read again under its thread's lock), or
        supersede it if its run moved on. Whether it expired."""
        ctx = self._ctx
        async with ctx.lock(due.thread_id):
            approval = await ctx.approvals.get(due.approval_id)
            run = await ctx.runs.get(due.run_id)
            if approval is None or run is None or approval.status is not ApprovalStatus.PENDING:
                return False
            if run.status.terminal or run.checkpoint_version != approval.checkpoint_version:
                await self._supersede(run, [approval.approval_id], "the run moved on")
                return False
            if run.status is RunStatus.WAITING_FOR_REVIEW:
                return await self._expire_locked(run, approval)
            return False

    def start_expiry(self) -> None:
        """Sweep for expired approvals every `approval_sweep_s`, when approvals expire at all.

        A decision arriving after `expires_at` is refused (and expires the approval) whether
        or not the sweep has run, so the sweep only bounds how late an unattended expiry is.
        """
        if self._approval_ttl_s <= 0:
            return

        async def loop() -> None:
            while not self._ctx.closing:
                await asyncio.sleep(self._approval_sweep_s)
                try:
                    await self.expire_due()
                except Exception as exc:
                    log_failure(log, exc, "approval expiry sweep failed")

        self._ctx.spawn(loop(), name="approval-expiry")
