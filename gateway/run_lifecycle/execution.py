"""One streamed segment of a run: the background task that owns an SDK stream.

A segment starts from the run's input (a fresh run, or a restart after a crash with no
checkpoint) or from a restored `RunState` (a continuation after decisions, or a recovery). It is
never tied to a socket. It ends in exactly one of: paused for approval (checkpoint + approvals +
events in one transaction), completed, failed, or cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from agents import (
    Agent,
    RawResponsesStreamEvent,
    RunItemStreamEvent,
    Runner,
)
from agents.exceptions import (
    InputGuardrailTripwireTriggered,
    MaxTurnsExceeded,
    ModelBehaviorError,
    OutputGuardrailTripwireTriggered,
)
from agents.items import ToolApprovalItem
from agents.models.interface import ModelProvider
from agents.run_state import CURRENT_SCHEMA_VERSION, RunState
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from gateway.agents.approval_rules import RuleDecision, evaluate
from gateway.agents.edited_arguments import current_edits
from gateway.agents.exactly_once import LedgerScope, current_scope
from gateway.agents.registry import AgentGraph
from gateway.agents.run_caller import RunCaller
from gateway.agents.run_settings import run_config
from gateway.auth.audit_trail import rule_decision_entry
from gateway.event_log.writer import EventLog
from gateway.observability.log_fields import bound
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.run_hooks import MetricsHooks
from gateway.observability.tracing import Telemetry
from gateway.protocol.frames import MODEL_USAGE, TOOL_NEEDS_RECONCILIATION, EventType, utc_ts
from gateway.protocol.wire_size import encoded_size
from gateway.run_lifecycle.approval_binding import (
    arguments_digest,
    interruption_arguments,
    interruption_digest,
    interruption_tool_name,
)
from gateway.run_lifecycle.lease_keeper import LeaseKeeper
from gateway.run_lifecycle.review_rules import ReviewContext, review_context
from gateway.run_lifecycle.sensitive_arguments import masked_call_data
from gateway.run_lifecycle.stream_translation import StreamTranslator, output_text, usage_counts
from gateway.storage.health import describe, is_outage
from persistence.approvals import ApprovalRecord, ApprovalRepository, ApprovalStatus
from persistence.audit import AuditEntry, AuditRepository
from persistence.checkpoints import CheckpointRecord, CheckpointRepository
from persistence.clock import utcnow
from persistence.errors import StaleWrite, StorageUnavailable
from persistence.events import NewEvent
from persistence.ids import new_id
from persistence.leases import Lease, LeaseLost, LeaseRepository, fenced
from persistence.ledger import OperationRepository, OperationStatus, outcome_in
from persistence.run_status import RunStatus, moves_into
from persistence.runs import RunRecord, RunRepository
from persistence.session_marks import SessionMarks
from persistence.sessions import GatewaySession
from persistence.store import Store

if TYPE_CHECKING:
    from agents.result import RunResultStreaming

log = logging.getLogger(__name__)

# `run.failed` code: a guardrail of the graph's run settings tripped
# (gateway/agents/run_settings.py).
GUARDRAIL_TRIPPED = "guardrail_tripped"
T = TypeVar("T")


@dataclass
class Segment:
    """What a segment starts from and how it began."""

    run: RunRecord
    graph: AgentGraph
    agent: Agent[Any]
    start: str | RunState[Any, Any]
    # Who the run runs for; its context and settings are made from it.
    caller: RunCaller
    known_calls: dict[str, str] = field(default_factory=dict)
    context: Any = None
    # call ids whose `tool.output` is already in the run's log (a recovery replays the turn)
    logged_outputs: frozenset[str] = frozenset()
    # This process's lease on the run: every write for the segment is fenced with it.
    lease: Lease | None = None
    # In-memory work on `start` left to the segment (a continuation's decisions): done first,
    # and if it fails the run fails like any run that raises.
    prepare: Callable[[], None] | None = None
    # call id -> edited arguments (JSON) of calls approved with an edit, for the tools to run
    # with (gateway/agents/edited_arguments.py).
    edits: Mapping[str, str] = field(default_factory=dict)
    # The run's first commit created its thread: the thread's session holds nothing yet,
    # so the SDK's read of its history at the start is answered without reading it.
    thread_created: bool = False
    # The state taken at a turn's tool outputs, stored as a turn checkpoint once the next
    # model call starts (the session mark is right only then), or when that call fails.
    unsaved_turn: str | None = None


@dataclass
class Execution:
    """A live segment: the task and the SDK result it drives."""

    run_id: str
    thread_id: str
    on_disconnect: str = "continue"
    task: asyncio.Task[None] | None = None
    result: RunResultStreaming | None = None
    cancel_requested: bool = False
    # Who asked for the cancel: written in the transaction that stores `run.cancelled`, then
    # cleared, so the canceller can tell whether its cancel is what ended the run.
    cancel_audit: AuditEntry | None = None
    # Set with cancel("after_turn") to suspend at the next turn boundary: "disconnect" when
    # the last watcher left a `suspend` run, "shutdown" on a graceful stop.
    stop_reason: str | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def request_stop(self, reason: str) -> None:
        """Let the current turn finish, then checkpoint and suspend (see `stop_reason`)."""
        if self.stop_reason is None and not self.cancel_requested:
            self.stop_reason = reason
            if self.result is not None:
                self.result.cancel("after_turn")


def approval_view(record: ApprovalRecord, review: ReviewContext | None = None) -> dict[str, Any]:
    """The shape clients see in `inbox`, `inbox.update` and the HTTP API.

    With `review`, also who may decide it: `decided_by` (the run's own user, reviewers or
    either), `owner` (the thread's owner: the run's own user), `reviewer_roles` (one of them is
    needed; empty: any reviewer) and `requested_by` (who may not approve it under the four-eyes
    rule). Readers' views add what each may do (`decision_rights`).
    """
    view: dict[str, Any] = {
        "approval_id": record.approval_id,
        "thread_id": record.thread_id,
        "run_id": record.run_id,
        "tool_name": record.tool_name,
        "arguments": record.arguments,
        "agent": record.agent,
        "call_id": record.call_id,
        "checkpoint_version": record.checkpoint_version,
        "status": record.status.value,
        "requested_at": utc_ts(record.requested_at),
        "expires_at": utc_ts(record.expires_at) if record.expires_at else None,
    }
    if record.edited_arguments is not None:
        view["edited_arguments"] = record.edited_arguments
    if review is not None:
        view["reviewer_roles"] = sorted(review.reviewer_roles)
        view["requested_by"] = review.requested_by
        view["decided_by"] = review.decided_by.value
        view["owner"] = review.owner
        view["run_input"] = review.run_input
        view["arguments_editable"] = review.arguments_editable
    if record.status is not ApprovalStatus.PENDING:
        view["reviewer"] = record.reviewer
        view["reason"] = record.reason
        view["decided_at"] = utc_ts(record.decided_at) if record.decided_at else None
    return view


class SegmentRunner:
    """Drives segments; knows the SDK, the event log and the stores, not the sockets."""

    def __init__(
        self,
        *,
        store: Store,
        log: EventLog,
        provider: ModelProvider,
        tracing: bool,
        telemetry: Telemetry | None = None,
        on_inbox_added: Callable[[str, list[dict[str, Any]]], None],
        on_finished: Callable[[RunRecord, RunStatus], Awaitable[None]],
        on_suspended: Callable[[RunRecord, str], Awaitable[None]],
        on_paused: Callable[[CheckpointRecord, AgentGraph], None] | None = None,
        lease_ttl_s: float = 15.0,
        approval_ttl_s: float = 0.0,
        self_approval: bool = False,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self._store = store
        # GATEWAY_SELF_APPROVAL: who decides the calls of tools the graph says nothing about.
        self._self_approval = self_approval
        self._metrics = metrics
        self._log = log
        self._marks = SessionMarks(store)
        self._provider = provider
        self._tracing = tracing
        # Public: decisions record approval waits with it too.
        self.telemetry = telemetry or Telemetry(None)
        self._on_inbox_added = on_inbox_added
        self._on_finished = on_finished
        self._on_suspended = on_suspended
        # Told of every checkpoint stored for an approval, once it is durable (its decisions
        # will need it restored: gateway/run_lifecycle/restored_checkpoints.py).
        self._on_paused = on_paused
        self._leases = LeaseKeeper(log, lease_ttl_s)
        # Side effects' outcomes whose queued write failed, written again on their own.
        self._outcome_retries: set[asyncio.Task[None]] = set()
        # Held while a finished run's state is serialised (`_checkpoint`): endings take turns.
        self._serializing = asyncio.Lock()
        # GATEWAY_APPROVAL_TTL_S: stamped on each approval as `expires_at` (0: approvals wait).
        self._approval_ttl_s = approval_ttl_s
        # The SDK's SQLAlchemySession adds a connect listener to the engine the first time one
        # is built. Doing that while other tasks open connections breaks SQLAlchemy's listener
        # iteration ("deque mutated during iteration"), so build one now, before serving.
        # It is also the template every run's session is copied from (`session`).
        self._sessions = GatewaySession("gateway-start-up", store=store)

    def session(self, thread_id: str, *, empty: bool = False) -> GatewaySession:
        """The thread's session; `empty`: known to hold nothing yet (`Segment.thread_created`)."""
        return self._sessions.for_session(thread_id, empty=empty)

    async def drive(self, segment: Segment, execution: Execution) -> None:
        run = segment.run
        translator = StreamTranslator(
            agent=speaking_agent(segment),
            call_names=dict(segment.known_calls),
            skip_outputs=set(segment.logged_outputs),
            sensitive=segment.graph.sensitive_arguments,
        )
        scope = current_scope.set(
            LedgerScope(
                scope=run.operations_scope,
                repository=OperationRepository(self._store),
                on_reconcile=partial(self._needs_reconciliation, segment),
                record_outcome=partial(self._record_outcome, run.operations_scope),
            )
        )
        edits = current_edits.set(segment.edits)
        spans = self.telemetry.segment(
            {
                "gateway.thread.id": run.thread_id,
                "gateway.run.id": run.run_id,
                "gateway.agent": segment.agent.name,
            }
        )
        try:
            if segment.prepare is not None:
                segment.prepare()
            settings = segment.graph.settings_for(segment.caller)
            start = segment.start
            decided: dict[str, RuleDecision] = {}
            # Calls rules decided in this segment: one asking again is left to a person, so a
            # call the SDK keeps re-interrupting cannot loop here.
            ruled: set[str] = set()
            fresh = segment.thread_created
            while True:
                result = Runner.run_streamed(
                    segment.agent,
                    start,
                    session=self.session(run.thread_id, empty=fresh),
                    run_config=run_config(
                        settings, segment.caller, provider=self._provider, tracing=self._tracing
                    ),
                    # The metrics' hooks pass every callback on to the graph's own.
                    hooks=(
                        MetricsHooks(self._metrics, settings.hooks)
                        if self._metrics is not None
                        else settings.hooks
                    ),
                    max_turns=segment.graph.max_turns,
                    # On a restored state, replaces only the application context the SDK keeps.
                    context=segment.context,
                )
                execution.result = result
                fresh = False
                if segment.lease is not None:
                    self._leases.hold(segment.lease, partial(_stop_on_lost_lease, run, result))
                await self._stream(segment, result, translator, spans)
                if execution.cancel_requested or not result.interruptions:
                    break
                decided = self._ask_rules(segment, result.interruptions, skip=ruled)
                if len(decided) < len(result.interruptions):
                    break
                ruled |= decided.keys()
                # Rules decided every call: the run goes on in this segment, without a pause
                # (docs/protocol.md §4 "Rules that decide").
                await storage_retry(partial(self._record_rules, segment, result, decided))
                if execution.cancel_requested:
                    break  # cancelled meanwhile: the calls are not run
                start = with_rule_decisions(result, decided)
            if execution.cancel_requested:
                await self._finish_cancelled(segment, translator, execution)
            elif result.interruptions:
                await storage_retry(partial(self._pause, segment, result, translator, decided))
            elif (reason := execution.stop_reason) is not None and result.final_output is None:
                # Stopped with cancel("after_turn"): the state is at a turn boundary
                # (NextStepRunAgain), so resuming repeats nothing.
                await storage_retry(lambda: self._suspend(segment, result, translator, reason))
                await self._on_suspended(segment.run, reason)
            else:
                await storage_retry(lambda: self._complete(segment, translator, result))
        except asyncio.CancelledError:
            # Task cancellation only happens at process shutdown; the run stays active in the
            # database and is recovered on the next start.
            if execution.result is not None:
                execution.result.cancel("immediate")
            raise
        except (StaleWrite, LeaseLost):
            # Cancelled meanwhile, or another process took the run over: it owns the run now.
            log.info("run %s moved on while streaming; segment discarded", run.run_id)
            if execution.result is not None:
                execution.result.cancel("immediate")
        except Exception as exc:
            if is_outage(exc):
                # Nothing may be decided without storage (the SDK's session writes raise raw
                # driver errors): the run stays active in the database and continues from its
                # newest checkpoint when the lease scan or the next start recovers it.
                # The outage itself is logged once, by the storage health.
                log.warning(
                    "run %s stopped: storage unavailable (%s); it continues from its newest "
                    "checkpoint when storage recovers",
                    run.run_id,
                    describe(exc),
                )
                if execution.result is not None:
                    execution.result.cancel("immediate")
            elif execution.cancel_requested:
                await self._finish_cancelled(segment, translator, execution)
            else:
                if tripped_guardrail(exc) is None:
                    log.error("run %s failed", run.run_id, exc_info=True)
                else:
                    # The graph's own policy stopped the run: an outcome, not a fault.
                    log.info("run %s stopped by a guardrail", run.run_id)
                spans.fail(exc)
                await self._fail(segment, translator, exc, execution.result)
        finally:
            spans.close(_outcome(execution))
            if segment.lease is not None:
                self._leases.drop(segment.lease)
            current_scope.reset(scope)
            current_edits.reset(edits)
            execution.done.set()

    async def close(self) -> None:
        for task in self._outcome_retries:
            task.cancel()
        await asyncio.gather(*self._outcome_retries, return_exceptions=True)
        await self._leases.close()

    async def _stream(
        self,
        segment: Segment,
        result: RunResultStreaming,
        translator: StreamTranslator,
        spans: Any,
    ) -> None:
        """Log one SDK stream's events, with turn checkpoints between its turns."""
        run = segment.run
        segment.unsaved_turn = None
        async for sdk_event in result.stream_events():
            if _is_tool_output(sdk_event):
                # A consistent point (docs/architecture.md "SDK behaviours"): the turn's tools
                # have run.
                segment.unsaved_turn = self._serialize(segment, result)
            elif segment.unsaved_turn is not None and _is_response_start(sdk_event):
                # The next model call has started, so the SDK has written the finished
                # turn to the session: only now is the session mark right for that state.
                await self._save_turn(segment, segment.unsaved_turn)
                segment.unsaved_turn = None
            emitted = translator.translate(sdk_event)
            spans.observe(sdk_event, emitted)
            for type_, data in emitted:
                await self._log.append(run.thread_id, run.run_id, type_, data, segment.lease)
                if type_ == MODEL_USAGE and self._metrics is not None:
                    self._metrics.tokens(data["agent"], data)

    # -- approval rules (gateway/agents/approval_rules.py) -------------------------------

    def _ask_rules(
        self, segment: Segment, items: Sequence[ToolApprovalItem], skip: set[str]
    ) -> dict[str, RuleDecision]:
        """What the graph's approval rules decide about the pause's calls, by call id, on the
        real arguments and the run's caller; calls they leave (or fail on), and those of
        `skip`, are absent."""
        decided: dict[str, RuleDecision] = {}
        for item in items:
            tool_name = interruption_tool_name(item)
            rule = segment.graph.approval_rules.get(tool_name)
            if rule is None or str(item.call_id or "") in skip:
                continue
            decision, outcome = evaluate(
                rule, tool_name, interruption_arguments(item), segment.caller
            )
            if self._metrics is not None:
                self._metrics.rule_evaluated(rule.name, outcome)
            if decision is not None:
                decided[str(item.call_id or "")] = decision
        return decided

    def _rule_events(
        self,
        segment: Segment,
        items: Sequence[ToolApprovalItem],
        decided: dict[str, RuleDecision],
    ) -> tuple[list[NewEvent], list[AuditEntry], dict[str, str]]:
        """`approval.decided` and the audit entry of each call a rule decided, and the approval
        id each got (by call id). The id is new: the call never became an approval anyone
        waits for, so the event names the call."""
        run = segment.run
        now = utc_ts(utcnow())
        events: list[NewEvent] = []
        entries: list[AuditEntry] = []
        ids: dict[str, str] = {}
        for item in items:
            call_id = str(item.call_id or "")
            decision = decided.get(call_id)
            if decision is None:
                continue
            approval_id = ids[call_id] = new_id("ap")
            tool_name = interruption_tool_name(item)
            data = {
                "approval_id": approval_id,
                "call_id": call_id,
                "tool_name": tool_name,
                "decision": decision.decision,
                "reason": decision.reason,
                "reviewer": None,
                "rule": decision.rule,
                "decided_at": now,
            }
            events.append(self._ev(segment, EventType.APPROVAL_DECIDED, data))
            entries.append(
                rule_decision_entry(
                    tenant=run.tenant,
                    approval_id=approval_id,
                    decision=decision.decision,
                    rule=decision.rule,
                    run_id=run.run_id,
                    thread_id=run.thread_id,
                    tool_name=tool_name,
                    arguments_digest=interruption_digest(item),
                )
            )
        return events, entries, ids

    async def _record_rules(
        self, segment: Segment, result: RunResultStreaming, decided: dict[str, RuleDecision]
    ) -> None:
        """Rules decided every call of the pause: their decisions and audit entries, in one
        transaction, before the run goes on with them."""
        events, entries, _ = self._rule_events(segment, result.interruptions, decided)

        # The events carry the run's lease: the commit fences them, and this with them.
        def store(conn: Connection) -> None:
            for entry in entries:
                AuditRepository.insert_in(conn, entry)

        await self._commit(segment, events, store, None)

    def _serialize(
        self, segment: Segment, result: RunResultStreaming, *, final: bool = False
    ) -> str:
        state = result.to_state()
        data = state.to_json(context_serializer=segment.graph.serialize_context)
        if final:
            elide_session_history(data)
        return orjson.dumps(data).decode()

    async def _save_turn(self, segment: Segment, state_json: str) -> None:
        """A turn checkpoint: a crash from here on loses at most the model call in flight."""
        run = segment.run
        checkpoint = CheckpointRecord(
            run_id=run.run_id,
            version=run.checkpoint_version + 1,
            state=state_json,
            sdk_schema_version=CURRENT_SCHEMA_VERSION,
            graph_name=segment.graph.name,
            graph_version=segment.graph.version,
            reason="turn",
            # Read now, not in the storing transaction: the next turn is already under way and
            # its session writes must stay after the mark.
            session_mark=await self._marks.head(run.thread_id),
            created_at=utcnow(),
        )
        lease = segment.lease

        def store(conn: Connection) -> None:
            CheckpointRepository.save_in(
                conn,
                checkpoint,
                status=RunStatus.RUNNING,
                expected=(RunStatus.RUNNING,),
                lease=lease,
            )

        await self._commit(segment, (), store, checkpoint)
        segment.run = replace(run, checkpoint_version=checkpoint.version)

    async def _record_outcome(
        self, scope: str, call_id: str, status: OperationStatus, text: str
    ) -> None:
        """A side effect's outcome, queued on the event log's writer, not waited for: the SDK
        goes on with the tool's output while it is written, and whatever the run stores next
        (the output first) is queued after it, so stored after it. If it cannot be stored it
        is retried on its own and the run goes on (waited for, a failed record failed a run
        whose side effect had happened); until it is stored the ledger shows the call
        `started`, as after a crash between the side effect and its record (docs/agents.md
        "Side effects exactly once")."""
        stored = await self._log.queue_commit(
            action=outcome_in(scope, call_id, status, text), single_statement=True
        )
        stored.add_done_callback(partial(self._outcome_stored, scope, call_id, status, text))

    def _outcome_stored(
        self,
        scope: str,
        call_id: str,
        status: OperationStatus,
        text: str,
        stored: asyncio.Future[Any],
    ) -> None:
        if stored.cancelled() or stored.exception() is None:
            return
        log.warning(
            "the outcome of call %s could not be stored (%s); retrying",
            call_id,
            type(stored.exception()).__name__,
        )
        retry = partial(OperationRepository(self._store).finish, scope, call_id, status, text)
        task = asyncio.create_task(storage_retry(retry), name=f"operation-outcome-{call_id}")
        self._outcome_retries.add(task)
        task.add_done_callback(self._outcome_retried)

    def _outcome_retried(self, task: asyncio.Task[None]) -> None:
        self._outcome_retries.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        # The error's type only: the driver's own message quotes the statement's parameters,
        # the tool's output among them.
        log.error(
            "%s could not be stored (%s): the ledger shows the call started",
            task.get_name(),
            type(task.exception()).__name__,
        )

    async def _needs_reconciliation(
        self, segment: Segment, call_id: str, tool_name: str, key: str
    ) -> None:
        run = segment.run
        await self._log.append(
            run.thread_id,
            run.run_id,
            TOOL_NEEDS_RECONCILIATION,
            {"call_id": call_id, "tool_name": tool_name, "idempotency_key": key},
            segment.lease,
        )

    async def _commit(
        self,
        segment: Segment,
        events: Sequence[NewEvent],
        action: Callable[[Connection], T],
        checkpoint: CheckpointRecord | None,
    ) -> T:
        """The segment's transaction that stores `checkpoint` (if any): its write time is
        measured as the run waits for it, queue included."""
        started = time.perf_counter()
        result, _ = await self._log.commit(events, action, agent=segment.graph.name)
        if self._metrics is not None and checkpoint is not None:
            self._metrics.checkpoint_stored(
                encoded_size(checkpoint.state), time.perf_counter() - started
            )
        return result  # type: ignore[no-any-return]

    def _ev(self, segment: Segment, type_: str, data: Any) -> NewEvent:
        return self._log.new_event(
            segment.run.thread_id, segment.run.run_id, type_, data, segment.lease
        )

    # -- endings -------------------------------------------------------------------------

    async def _checkpoint(
        self, segment: Segment, result: RunResultStreaming, reason: str, *, final: bool = False
    ) -> CheckpointRecord:
        """The state after the stream ended. Its `session_mark` is left at 0: it is read in
        the transaction that stores the checkpoint (`session_of`), where nothing writes to
        the session any more and it costs no round trip of its own.

        Serialising takes the SDK 1.5-3 ms of CPU in one piece. Runs that end together (a
        burst of completions or pauses) take turns, one serialisation per turn of the loop,
        so other runs' events and sends go between two of them instead of waiting behind all
        of them; alone, a run pays one loop turn.
        """
        async with self._serializing:
            await asyncio.sleep(0)
            state = self._serialize(segment, result, final=final)
        run = segment.run
        return CheckpointRecord(
            run_id=run.run_id,
            version=run.checkpoint_version + 1,
            state=state,
            sdk_schema_version=CURRENT_SCHEMA_VERSION,
            graph_name=segment.graph.name,
            graph_version=segment.graph.version,
            reason=reason,
            session_mark=0,
            created_at=utcnow(),
        )

    async def _pause(
        self,
        segment: Segment,
        result: RunResultStreaming,
        translator: StreamTranslator,
        decided: dict[str, RuleDecision],
    ) -> None:
        """Checkpoint + approvals + `approval.requested` x k + `run.paused`, one transaction.

        Calls the graph's rules decided (`decided`, some of the pause's) are requested from
        nobody: their `approval.decided` comes first and their rows are stored decided, so the
        continuation applies them together with the people's decisions."""
        run = segment.run
        checkpoint = await self._checkpoint(segment, result, "approval")
        now = checkpoint.created_at
        expires_at = now + timedelta(seconds=self._approval_ttl_s) if self._approval_ttl_s else None
        records: list[ApprovalRecord] = []
        for item in result.interruptions:
            # Computed as gateway/run_lifecycle/approval_binding.py recomputes it from the
            # checkpoint before deciding.
            tool_name = interruption_tool_name(item)
            arguments = interruption_arguments(item)
            records.append(
                ApprovalRecord(
                    approval_id=new_id("ap"),
                    run_id=run.run_id,
                    thread_id=run.thread_id,
                    tenant=run.tenant,
                    checkpoint_version=checkpoint.version,
                    call_id=str(item.call_id or ""),
                    tool_name=tool_name,
                    agent=getattr(item.agent, "name", translator.agent),
                    arguments=arguments,
                    arguments_digest=arguments_digest(tool_name, arguments),
                    status=ApprovalStatus.PENDING,
                    reviewer=None,
                    reason=None,
                    requested_at=now,
                    decided_at=None,
                    expires_at=expires_at,
                )
            )
        events = [self._ev(segment, type_, data) for type_, data in translator.abort_open("paused")]
        ruled, audit, rule_ids = self._rule_events(segment, result.interruptions, decided)
        events.extend(ruled)
        # The rows of the rules' decisions, under the ids their events gave them.
        records = [
            r if r.call_id not in rule_ids else _ruled(r, rule_ids[r.call_id], decided[r.call_id])
            for r in records
        ]
        pending = [r for r in records if r.status is ApprovalStatus.PENDING]
        reviews = {
            r.approval_id: review_context(
                run, r.tool_name, segment.graph, self_approval=self._self_approval
            )
            for r in pending
        }
        for record in pending:
            data: dict[str, Any] = {
                "approval_id": record.approval_id,
                "call_id": record.call_id,
                "tool_name": record.tool_name,
                "arguments": record.arguments,
                "agent": record.agent,
                "checkpoint_version": checkpoint.version,
                "requested_at": utc_ts(now),
                "expires_at": utc_ts(expires_at) if expires_at else None,
                "reviewer_roles": sorted(reviews[record.approval_id].reviewer_roles),
                # Who decides, the same for every reader; what one reader may do is in views.
                "decided_by": reviews[record.approval_id].decided_by.value,
                "arguments_editable": reviews[record.approval_id].arguments_editable,
            }
            # The log is read by viewers too: sensitive values are masked here, and put back
            # for reviewers at send time (gateway/run_lifecycle/sensitive_arguments.py).
            data = masked_call_data(data, record.tool_name, segment.graph.sensitive_arguments)
            events.append(self._ev(segment, EventType.APPROVAL_REQUESTED, data))
        stored = await self._store_pause(
            segment, checkpoint, RunStatus.WAITING_FOR_REVIEW, events, records=records, audit=audit
        )
        if self._on_paused is not None:
            self._on_paused(stored, segment.graph)
        self._on_inbox_added(
            run.tenant, [approval_view(r, reviews[r.approval_id]) for r in pending]
        )

    async def _suspend(
        self,
        segment: Segment,
        result: RunResultStreaming,
        translator: StreamTranslator,
        reason: str,
    ) -> None:
        """After an `after_turn` stop: checkpoint at the turn boundary, `run.paused`, suspended."""
        checkpoint = await self._checkpoint(segment, result, reason)
        events = [self._ev(segment, type_, data) for type_, data in translator.abort_open("paused")]
        await self._store_pause(segment, checkpoint, RunStatus.SUSPENDED, events)

    async def _store_pause(
        self,
        segment: Segment,
        checkpoint: CheckpointRecord,
        status: RunStatus,
        events: list[NewEvent],
        records: list[ApprovalRecord] | None = None,
        audit: Sequence[AuditEntry] = (),
    ) -> CheckpointRecord:
        """Returns the checkpoint as stored (with the session mark read in the transaction)."""
        events.append(
            self._ev(
                segment,
                EventType.RUN_PAUSED,
                {"reason": checkpoint.reason, "checkpoint_version": checkpoint.version},
            )
        )

        thread_id, lease = segment.run.thread_id, segment.lease

        def store(conn: Connection) -> CheckpointRecord:
            # A paused run holds no lease: whichever process wins the continuation does.
            stored = CheckpointRepository.save_in(
                conn,
                checkpoint,
                status=status,
                expected=moves_into(status),
                session_of=thread_id,
                lease=lease,
                release=True,
            )
            if records:
                ApprovalRepository.insert_in(conn, records)
            for entry in audit:
                AuditRepository.insert_in(conn, entry)
            return stored

        return await self._commit(segment, events, fenced(lease, store), checkpoint)

    async def _complete(
        self, segment: Segment, translator: StreamTranslator, result: RunResultStreaming
    ) -> None:
        final = result.final_output
        events = [self._ev(segment, t, d) for t, d in translator.abort_open("incomplete")]
        events.append(
            self._ev(
                segment,
                EventType.RUN_COMPLETED,
                {
                    "final_output": output_text(final) if final is not None else "",
                    **run_usage(result),
                },
            )
        )
        checkpoint = await self._final_checkpoint(segment, result, "completed")
        await self._end(segment, RunStatus.COMPLETED, events, checkpoint=checkpoint)

    async def _fail(
        self,
        segment: Segment,
        translator: StreamTranslator,
        exc: Exception,
        result: RunResultStreaming | None,
    ) -> None:
        error = failure(exc)
        if segment.unsaved_turn is not None:
            # The next model call failed after the SDK wrote the finished turn to the
            # session: that turn's boundary is stored, for a retry to go on from.
            await self._save_unsaved_turn(segment)
        events = [self._ev(segment, t, d) for t, d in translator.abort_open("failed")]
        events.append(
            self._ev(segment, EventType.RUN_FAILED, {"error": error, **run_usage(result)})
        )
        checkpoint = await self._final_checkpoint(segment, result, "error")
        await storage_retry(
            lambda: self._end(segment, RunStatus.FAILED, events, error=error, checkpoint=checkpoint)
        )

    async def _save_unsaved_turn(self, segment: Segment) -> None:
        """Best effort, like the final checkpoint: the run fails whether or not it is stored."""
        assert segment.unsaved_turn is not None
        try:
            await storage_retry(partial(self._save_turn, segment, segment.unsaved_turn))
        except Exception:
            log.warning(
                "run %s: its last turn checkpoint was not stored",
                segment.run.run_id,
                exc_info=True,
            )
        segment.unsaved_turn = None

    async def _final_checkpoint(
        self, segment: Segment, result: RunResultStreaming | None, reason: str
    ) -> CheckpointRecord | None:
        """The state a run ended with, kept for inspection (a terminal run is never resumed).

        Best effort: a state the SDK cannot serialize (the error may have come from
        serialization itself) must not keep the run from ending.
        """
        if result is None:
            return None
        try:
            return await self._checkpoint(segment, result, reason, final=True)
        except Exception:
            log.warning(
                "run %s: no %s checkpoint, the state did not serialize",
                segment.run.run_id,
                reason,
                exc_info=True,
            )
            return None

    async def _finish_cancelled(
        self, segment: Segment, translator: StreamTranslator, execution: Execution
    ) -> None:
        kept = translator.stopped_texts()
        events = [self._ev(segment, t, d) for t, d in translator.abort_open("cancelled")]
        events.append(self._ev(segment, EventType.RUN_CANCELLED, run_usage(execution.result)))
        await self._end(segment, RunStatus.CANCELLED, events, audit=execution.cancel_audit)
        execution.cancel_audit = None
        if kept:
            await self._keep_stopped(segment, kept)

    async def _keep_stopped(self, segment: Segment, texts: list[str]) -> None:
        """The text a stop cut short joins the conversation's history, as the assistant's,
        so the agent's next turn sees what the user saw (the SDK drops a cut turn's output).
        Best effort: the run is cancelled whether or not this is written."""
        items: list[Any] = [{"role": "assistant", "content": text} for text in texts]
        try:
            await self.session(segment.run.thread_id).add_items(items)
        except Exception as exc:
            log.warning(
                "run %s: the stopped message's text was not added to the history (%s)",
                segment.run.run_id,
                describe(exc),
            )

    async def _end(
        self,
        segment: Segment,
        status: RunStatus,
        events: list[Any],
        error: dict[str, Any] | None = None,
        checkpoint: CheckpointRecord | None = None,
        audit: AuditEntry | None = None,
    ) -> None:
        run, lease = segment.run, segment.lease

        def transition(conn: Connection) -> None:
            # A failed run keeps its last boundary too: a retry goes on from there
            # (docs/protocol.md §4 `run.retry`).
            failed = status is RunStatus.FAILED
            if checkpoint is not None:
                # The final status with the final state and the lease's release, in one step.
                CheckpointRepository.add_final_in(
                    conn,
                    checkpoint,
                    status=status,
                    error=error,
                    session_of=run.thread_id,
                    keep_previous=failed,
                    lease=lease,
                )
            else:
                moved = RunRepository.transition_in(
                    conn, run.run_id, status, expected=moves_into(status), error=error
                )
                if not moved:
                    raise StaleWrite(run.run_id)
                if not failed:
                    CheckpointRepository.drop_in(conn, run.run_id)
                if lease is not None:
                    LeaseRepository.release_in(conn, lease)
            if status is RunStatus.CANCELLED:
                ApprovalRepository.supersede_pending_in(conn, run.run_id)
            if audit is not None:
                AuditRepository.insert_in(conn, audit)

        work = fenced(lease, transition) if checkpoint is not None else transition
        await self._commit(segment, events, work, checkpoint)
        await self._on_finished(run, status)


# Set in a final state whose `original_input` lost its session-history prefix: how many items
# were left out. They are the thread's session items up to the run's `session_mark`.
ELIDED_HISTORY_KEY = "gateway_elided_history_items"


def with_rule_decisions(
    result: RunResultStreaming, decided: dict[str, RuleDecision]
) -> RunState[Any, Any]:
    """The state after `result`'s pause with the rules' decisions applied: the run goes on
    from it as from a continuation's restored state."""
    state = result.to_state()
    for item in state.get_interruptions():
        decision = decided[str(item.call_id or "")]
        if decision.decision == "approve":
            state.approve(item)
        else:
            state.reject(item, rejection_message=decision.reason)
    return state


def _ruled(record: ApprovalRecord, approval_id: str, decision: RuleDecision) -> ApprovalRecord:
    """A pause's approval row as a rule decided it (no reviewer; the rule is in its event)."""
    status = ApprovalStatus.of_verdict(decision.decision)
    return replace(
        record,
        approval_id=approval_id,
        status=status,
        reason=decision.reason,
        decided_at=record.requested_at,
        expires_at=None,
    )


def elide_session_history(data: dict[str, Any]) -> None:
    """Keep only the run's own input in a final state's `original_input`.

    With a session, the SDK's `original_input` is the session history the run started on plus
    the run's input (one user message: a run starts from its `runs.input`), so every state of a
    thread's n-th run repeats runs 1..n-1. A terminal run is never restored, and its history is
    the session's, so its final state keeps only its own input: a thread's stored bytes then
    grow with what was said, not with its square.
    """
    items = data.get("original_input")
    if isinstance(items, list) and len(items) > 1:
        data[ELIDED_HISTORY_KEY] = len(items) - 1
        data["original_input"] = items[-1:]


def run_usage(result: RunResultStreaming | None) -> dict[str, Any]:
    """`{"usage": …}`: the run's tokens over all its model calls. The SDK keeps the count in
    the run state, so it spans every segment of the run, pauses and restarts included (the
    calls of a turn cut by a crash are not in the checkpoint it resumed from)."""
    usage = getattr(getattr(result, "context_wrapper", None), "usage", None)
    if usage is None or not getattr(usage, "requests", 0):
        return {}
    return {"usage": {"requests": int(usage.requests), **usage_counts(usage)}}


def _outcome(execution: Execution) -> str:
    """How a segment ended, as its span says (gateway/observability/tracing.py)."""
    result = execution.result
    if execution.cancel_requested:
        return "cancelled"
    if result is None:
        return "failed"
    if result.interruptions:
        return "paused"
    if result.final_output is not None:
        return "completed"
    return "suspended" if execution.stop_reason is not None else "stopped"


def _is_tool_output(event: Any) -> bool:
    return isinstance(event, RunItemStreamEvent) and event.name == "tool_output"


def _is_response_start(event: Any) -> bool:
    return (
        isinstance(event, RawResponsesStreamEvent)
        and getattr(event.data, "type", None) == "response.created"
    )


async def storage_retry(
    operation: Callable[[], Awaitable[None]], delays: tuple[float, ...] = (0.2, 0.5, 1, 2, 4, 8)
) -> None:
    """Retry a run's final write while storage is down: the state is only in memory."""
    for delay in delays:
        try:
            await operation()
            return
        except StorageUnavailable:
            log.warning("storage unavailable; retrying in %.1f s", delay)
            await asyncio.sleep(delay)
    await operation()


def failure(exc: Exception) -> dict[str, Any]:
    """The `error` of `run.failed` (docs/protocol.md §6)."""
    tripped = tripped_guardrail(exc)
    if tripped is not None:
        kind, name = tripped
        return {
            "code": GUARDRAIL_TRIPPED,
            "message": f"{type(exc).__name__}: the {kind} guardrail {name!r} tripped",
            "guardrail": name,
            "guardrail_kind": kind,
        }
    return {"code": _failure_code(exc), "message": _failure_message(exc)}


def tripped_guardrail(exc: BaseException) -> tuple[str, str] | None:
    """("input" or "output", the guardrail's name) when a guardrail's tripwire ended the run."""
    if isinstance(exc, InputGuardrailTripwireTriggered):
        return "input", exc.guardrail_result.guardrail.get_name()
    if isinstance(exc, OutputGuardrailTripwireTriggered):
        return "output", exc.guardrail_result.guardrail.get_name()
    return None


def _failure_code(exc: Exception) -> str:
    if isinstance(exc, MaxTurnsExceeded):
        return "max_turns"
    if isinstance(exc, ModelBehaviorError):
        return "model_behavior"
    return "run_error"


def _failure_message(exc: Exception) -> str:
    # The exception text can hold model output or tool arguments; clients get the class and a
    # bounded message, logs get the traceback. Database errors carry SQL and parameters
    # (conversation content): never echoed.
    if isinstance(exc, DBAPIError):
        return f"{type(exc).__name__}: storage error"
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"


def speaking_agent(segment: Segment) -> str:
    """The agent the segment starts with: a continued state's own (a pause after a handoff
    goes on with the agent handed to, which the SDK announces again as it starts: already
    logged, it is no change), else the graph's starting agent."""
    if isinstance(segment.start, RunState):
        current = getattr(segment.start, "_current_agent", None)
        if current is not None:
            return str(current.name)
    return str(segment.agent.name)


def _stop_on_lost_lease(run: RunRecord, result: RunResultStreaming) -> None:
    """Another process took the run over: stop streaming at once (no more writes)."""
    if not result.is_complete:
        # Called from the lease keeper, which serves every run: the line names this one.
        with bound(thread_id=run.thread_id, run_id=run.run_id):
            log.warning("lost the lease of run %s; stopping its stream", run.run_id)
        result.cancel("immediate")
