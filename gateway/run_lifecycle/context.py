"""What the parts that handle runs share within one process.

The run lifecycle (gateway/run_lifecycle/manager.py), decisions
(gateway/run_lifecycle/decisions.py), continuations (gateway/run_lifecycle/continuation.py),
recovery (gateway/run_lifecycle/recovery.py) and the views (gateway/run_lifecycle/read_views.py) all
work on the same runs. They hold one `RunContext`, created by `RunManager`, so that they take the
same per-thread locks (which serialise this process's decisions about one thread: start, input,
decide, cancel, finish, recover), see the same set of runs this process streams, and leave their
background tasks where a graceful stop finds them.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

from sqlalchemy.engine import Connection

from gateway.agents.edited_arguments import with_editable_tools
from gateway.agents.registry import AgentGraph, AgentRegistry
from gateway.agents.run_caller import RunCaller, caller_of, latest_decision
from gateway.auth.access import ThreadRef
from gateway.event_log.bus import EventBus
from gateway.event_log.writer import EventLog
from gateway.observability.log_fields import bound, unbound_context
from gateway.observability.metrics import GatewayMetrics
from gateway.protocol.error_codes import not_found
from gateway.protocol.identity import Principal
from gateway.run_lifecycle.execution import Execution, Segment, SegmentRunner
from gateway.run_lifecycle.restored_checkpoints import RestoredStates
from persistence.approvals import ApprovalRecord, ApprovalRepository
from persistence.checkpoints import CheckpointRecord, CheckpointRepository
from persistence.events import EventRepository
from persistence.inputs import InputRepository
from persistence.leases import LeaseRepository
from persistence.runs import RunRecord, RunRepository
from persistence.session_marks import SessionMarks
from persistence.store import Store
from persistence.threads import ThreadRecord, ThreadRepository

# Approvals whose thread a process remembers (`RunContext.requested`): some 250 bytes each.
KNOWN_APPROVALS = 10_000


def thread_ref(thread: ThreadRecord) -> ThreadRef:
    return ThreadRef(tenant=thread.tenant, owner=thread.owner)


class RunContext:
    def __init__(
        self,
        *,
        store: Store,
        log: EventLog,
        bus: EventBus,
        registry: AgentRegistry,
        segments: SegmentRunner,
        instance_id: str,
        lease_ttl_s: float,
        incarnation: str | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.log = log
        self.bus = bus
        self.registry = registry
        self.instance_id = instance_id
        # This process's token on the instance id (persistence/instances.py): with it, leases
        # its dead predecessor left under the id are taken at once.
        self.incarnation = incarnation
        self.lease_ttl_s = lease_ttl_s
        self.threads = ThreadRepository(store)
        self.runs = RunRepository(store)
        self.approvals = ApprovalRepository(store)
        self.checkpoints = CheckpointRepository(store)
        self.inputs = InputRepository(store)
        self.events = EventRepository(store)
        self.sessions = SessionMarks(store)
        self.leases = LeaseRepository(store)
        # Set by a graceful stop: nothing new starts or continues, and the loops end.
        self.closing = False
        self.executions: dict[str, Execution] = {}
        self.background: set[asyncio.Task[Any]] = set()
        self.segments = segments
        self._agents: dict[tuple[str, str, int], Any] = {}
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        # approval id -> its thread, for approvals this process requested (the newest
        # `KNOWN_APPROVALS`): a decision on one takes the thread's lock at once and reads the
        # approval only under it. An approval's thread never changes, so an entry never lies.
        self._approval_threads: OrderedDict[str, str] = OrderedDict()
        # Checkpoints restored once for a pause's decisions and its continuation.
        self.restored = RestoredStates(self.agent, self.spawn)

    def lock(self, thread_id: str) -> asyncio.Lock:
        lock = self._locks.get(thread_id)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[thread_id] = lock
        return lock

    def requested(self, approvals: Iterable[Mapping[str, Any]]) -> None:
        """Remember the threads of approvals this process just requested (their views)."""
        known = self._approval_threads
        for view in approvals:
            known[view["approval_id"]] = view["thread_id"]
        while len(known) > KNOWN_APPROVALS:
            known.popitem(last=False)

    def approval_thread(self, approval_id: str) -> str | None:
        """The thread of an approval this process requested lately, if it is remembered."""
        return self._approval_threads.get(approval_id)

    def spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        """A background task that starts with no log fields: whatever started it (a run
        ending, a connection's request), its lines say which run or thread only where it binds
        them itself (a run's body does, `launch`)."""
        task = asyncio.create_task(coro, name=name, context=unbound_context())
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    # -- graphs --------------------------------------------------------------------------

    def agent(self, graph: AgentGraph) -> Any:
        """One built agent per graph version, reused by every run and restore.

        SDK agents hold no per-run state, and building one (tool schemas, nested agents) costs
        more than restoring a checkpoint, so it is done once, not on every decision.
        """
        key = (graph.name, graph.version, id(graph))
        agent = self._agents.get(key)
        if agent is None:
            agent = self._agents[key] = with_editable_tools(graph.build(), graph.editable_arguments)
        return agent

    def graph(self, name: str | None) -> AgentGraph:
        """The graph registered as `name`; an unknown one is the client's `bad_request`
        (`UnknownAgentError`)."""
        return self.registry.get(name)

    def graph_for_checkpoint(self, run: RunRecord, checkpoint: CheckpointRecord) -> AgentGraph:
        """The run's graph, if it accepts the checkpoint's version (else `graph_mismatch`,
        `GraphMismatchError`)."""
        graph = self.graph(run.agent)
        graph.check_version(checkpoint.graph_version)
        return graph

    async def caller(
        self, run: RunRecord, decisions: list[ApprovalRecord] | None = None
    ) -> RunCaller:
        """Who `run` runs for, as of now. `decisions`: the approvals of the pause being
        continued, when the caller has them; otherwise the run's latest decision is read."""
        latest = latest_decision(decisions or ())
        if latest is None:
            latest = await self.approvals.latest_decision(run.run_id)
        return caller_of(run, latest.reviewer if latest is not None else None)

    # -- the caller's threads and runs ---------------------------------------------------

    async def thread_for(self, principal: Principal, thread_id: str) -> ThreadRecord:
        thread = await self.threads.get(thread_id)
        if thread is None or thread.tenant != principal.tenant:
            raise not_found("thread not found")
        return thread

    async def run_for(self, principal: Principal, run_id: str) -> tuple[RunRecord, ThreadRecord]:
        run, thread = await self.store.read(partial(_run_and_thread, run_id))
        return _owned(principal, run, thread)

    async def approval_for(
        self, principal: Principal, approval_id: str
    ) -> tuple[ApprovalRecord, RunRecord, ThreadRecord]:
        """The caller's approval with its run and thread (else `not_found`), read together."""
        approval, run, thread = await self.store.read(
            partial(ApprovalRepository.with_run_and_thread_in, approval_id=approval_id)
        )
        if approval is None or approval.tenant != principal.tenant:
            raise not_found("approval not found")
        return approval, *_owned(principal, run, thread)

    # -- the runs this process streams ---------------------------------------------------

    def is_executing(self, run_id: str) -> bool:
        return run_id in self.executions

    def launch(self, segment: Segment) -> None:
        run = segment.run
        execution = Execution(
            run_id=run.run_id, thread_id=run.thread_id, on_disconnect=run.on_disconnect
        )
        self.executions[run.run_id] = execution

        async def body() -> None:
            try:
                # One turn of the loop first: whoever launched the run (a `run.start`, a
                # decision) has queued its answer and the run's first event by now, and they
                # reach the socket before the SDK's start-up, a few ms of CPU without a pause.
                # Under a burst of starts, each client then hears of its run at once instead
                # of after every other run's start-up.
                await asyncio.sleep(0)
                # The run's lines (the SDK's among them) say which run; a run started from a
                # connection is not that connection's work.
                with bound(
                    thread_id=run.thread_id,
                    run_id=run.run_id,
                    agent=segment.agent.name,
                    connection_id=None,
                ):
                    await self.segments.drive(segment, execution)
            finally:
                if self.executions.get(run.run_id) is execution:
                    del self.executions[run.run_id]

        execution.task = self.spawn(body(), name=f"run-{run.run_id}")


def _run_and_thread(run_id: str, conn: Connection) -> tuple[RunRecord | None, ThreadRecord | None]:
    run = RunRepository.get_in(conn, run_id)
    return run, ThreadRepository.get_in(conn, run.thread_id) if run is not None else None


def _owned(
    principal: Principal, run: RunRecord | None, thread: ThreadRecord | None
) -> tuple[RunRecord, ThreadRecord]:
    """`run_for`'s answer: the run and its thread, `not_found` outside the caller's tenant."""
    if run is None or run.tenant != principal.tenant:
        raise not_found("run not found")
    if thread is None or thread.tenant != principal.tenant:
        raise not_found("thread not found")
    return run, thread
