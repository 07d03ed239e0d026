"""Taking over runs whose process is gone: start-up recovery and the lease scan.

At start-up, and then every half lease TTL, each run left active that no live process holds
(its lease is free, expired, or this instance's own from before a restart) is moved to
`recovering`, its open messages are aborted, and it continues from its newest checkpoint, or
restarts from its input without one. Pauses whose decisions were all recorded but whose
continuation never started are continued too; at start-up, so are runs suspended by a graceful
shutdown. docs/architecture.md "Shutdown and crash recovery" lists the steps. The same loop
counts the operator's cancels no process has counted yet (gateway/run_lifecycle/
uncounted_cancels.py).
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any

import orjson
from sqlalchemy.engine import Connection

from gateway.agents.registry import GraphMismatchError
from gateway.protocol.frames import (
    REASONING_COMPLETED,
    REASONING_DELTA,
    REASONING_STARTED,
    EventType,
)
from gateway.run_lifecycle.context import RunContext
from gateway.run_lifecycle.continuation import Continuer
from gateway.run_lifecycle.execution import Segment
from gateway.run_lifecycle.uncounted_cancels import count_uncounted_cancels
from gateway.storage.health import log_failure
from persistence.clock import utcnow
from persistence.errors import StaleWrite
from persistence.events import NewEvent
from persistence.leases import Lease, LeaseLost, LeaseRepository
from persistence.run_status import RunStatus
from persistence.runs import RunRecord, RunRepository

log = logging.getLogger(__name__)

# The statuses of a run some process was executing: taken over when that process is gone.
TAKEN_OVER = (RunStatus.RUNNING, RunStatus.RESUMING, RunStatus.RECOVERING)
# The runs a process shutting down cut short (no turn boundary within its grace), their
# leases released: the others recover them at once.
CUT = (RunStatus.RUNNING, RunStatus.RECOVERING)


class Recovery:
    def __init__(self, ctx: RunContext, continuer: Continuer, scan_s: float | None = None) -> None:
        self._ctx = ctx
        self._continuer = continuer
        # The lease scan's interval: the runs of a process that died go on elsewhere within
        # the lease TTL plus this.
        self._scan_s = scan_s if scan_s is not None else ctx.lease_ttl_s / 2

    async def recover(self, *, startup: bool = True) -> int:
        """Take over runs whose process is gone (lease free or expired).

        At start-up also continue pauses whose decisions were all recorded before a crash,
        and runs suspended by a graceful shutdown.
        """
        ctx = self._ctx
        recovered = 0
        for run in await ctx.runs.with_status(TAKEN_OVER):
            if run.run_id in ctx.executions:
                continue
            if (
                not startup
                and run.status is RunStatus.RESUMING
                and (utcnow() - run.updated_at).total_seconds() < ctx.lease_ttl_s
            ):
                continue  # a continuation that some process is starting right now
            try:
                recovered += await self.recover_run(run)
            except Exception as exc:
                log_failure(log, exc, "recovery of run %s failed", run.run_id)
        waiting = (
            await ctx.runs.with_status((RunStatus.WAITING_FOR_REVIEW,))
            if startup
            else await ctx.runs.decided_but_waiting()
        )
        for run in waiting:
            try:
                async with ctx.lock(run.thread_id):
                    await self._continuer.maybe_continue(run)
            except Exception as exc:
                log_failure(log, exc, "resuming decided run %s failed", run.run_id)
        if not startup:
            return recovered
        for run in await ctx.runs.with_status((RunStatus.SUSPENDED,)):
            recovered += await self._continue_after_shutdown(run)
        return recovered

    async def take_over(self, run_ids: list[str]) -> int:
        """Continue now the runs another process handed over as it shut down (suspended at a
        turn boundary, or cut with their leases released). Every process that hears of them
        tries; the run's compare-and-swap and lease let one win."""
        taken = 0
        for run_id in run_ids:
            if run_id in self._ctx.executions:
                continue
            try:
                run = await self._ctx.runs.get(run_id)
                if run is None:
                    continue
                if run.status is RunStatus.SUSPENDED:
                    taken += await self._continue_after_shutdown(run)
                elif run.status in CUT:
                    taken += await self.recover_run(run)
                # RESUMING: another process that heard of it is continuing it right now (it
                # takes the lease a moment later). Were that process to die first, the run
                # has no lease and the lease scan recovers it.
            except Exception as exc:
                log_failure(log, exc, "taking over run %s failed", run_id)
        if taken:
            log.info("took over %d run(s) handed over by a process shutting down", taken)
            self._took_over("handover", taken)
        return taken

    async def _continue_after_shutdown(self, run: RunRecord) -> bool:
        """Continue a suspended run if a graceful shutdown suspended it (one suspended for lack
        of watchers waits for a watcher); True when this process continues it."""
        checkpoint = await self._ctx.checkpoints.latest(run.run_id)
        if checkpoint is None or checkpoint.reason != "shutdown":
            return False
        try:
            async with self._ctx.lock(run.thread_id):
                return await self._continuer.resume_suspended(run)
        except (LeaseLost, StaleWrite):
            return False  # another process continues it
        except Exception as exc:
            log_failure(log, exc, "continuing run %s after shutdown failed", run.run_id)
            return False

    def start(self) -> None:
        """Recover in the background, then keep taking over runs whose lease expired.

        In the background so the gateway listens at once: with many interrupted runs, recovery
        takes a while, and clients can connect (and catch up by cursor) meanwhile.
        """

        async def loop() -> None:
            try:
                recovered = await self.recover()
            except Exception as exc:
                log_failure(log, exc, "recovery at start-up failed")
            else:
                if recovered:
                    log.info("recovered %d run(s) left active by a previous process", recovered)
                    self._took_over("startup", recovered)
            await self._count_uncounted_cancels()
            while not self._ctx.closing:
                await asyncio.sleep(self._scan_s)
                await self._count_uncounted_cancels()
                try:
                    taken = await self.recover(startup=False)
                except Exception as exc:
                    log_failure(log, exc, "lease scan failed")
                    continue
                if taken:
                    log.info("took over %d run(s) whose lease had expired", taken)
                    self._took_over("lease_expired", taken)

        self._ctx.spawn(loop(), name="recovery")

    async def _count_uncounted_cancels(self) -> None:
        try:
            await count_uncounted_cancels(self._ctx.store, self._ctx.metrics)
        except Exception as exc:
            log_failure(log, exc, "counting the operator's cancels failed")

    def _took_over(self, kind: str, runs: int) -> None:
        if self._ctx.metrics is not None:
            self._ctx.metrics.took_over(kind, runs)

    async def recover_run(self, run: RunRecord) -> bool:
        """Take over a run whose process is gone; False when a live process still holds it."""
        ctx = self._ctx
        async with ctx.lock(run.thread_id):
            if run.run_id in ctx.executions:
                return False  # recovered meanwhile (start-up and the lease scan overlap)
            lease = await ctx.leases.acquire(
                run.run_id, ctx.instance_id, ctx.lease_ttl_s, ctx.incarnation
            )
            if lease is None:
                return False

            def mark_recovering(conn: Connection) -> None:
                if not RunRepository.transition_in(
                    conn,
                    run.run_id,
                    RunStatus.RECOVERING,
                    expected=TAKEN_OVER,
                ):
                    raise StaleWrite(run.run_id)

            try:
                await ctx.log.commit(await self._abort_open(run, lease), mark_recovering)
            except StaleWrite:
                # The run moved on after the scan read it (it paused, ended, was cancelled),
                # releasing its lease: the one taken here is given back at once, or it would
                # turn away a decision's continuation on another process, or an operator's
                # cancel, until it expired.
                await ctx.store.write(partial(LeaseRepository.release_in, lease=lease))
                return False
            checkpoint = await ctx.checkpoints.latest(run.run_id)
            if checkpoint is not None:
                approvals = await ctx.approvals.for_checkpoint(run.run_id, checkpoint.version)
                await self._continuer.continue_run(
                    run, approvals, EventType.RUN_RECOVERED, checkpoint, lease
                )
                return True
            graph = ctx.graph(run.agent)
            if not graph.accepts(run.graph_version):
                raise GraphMismatchError(graph.name, run.graph_version, graph.version)
            await ctx.sessions.trim(run.thread_id, run.session_mark)

            def mark_running(conn: Connection) -> None:
                if not RunRepository.transition_in(
                    conn, run.run_id, RunStatus.RUNNING, expected=(RunStatus.RECOVERING,)
                ):
                    raise StaleWrite(run.run_id)

            await ctx.log.commit(
                [
                    ctx.log.new_event(
                        run.thread_id,
                        run.run_id,
                        EventType.RUN_RECOVERED,
                        {"checkpoint_version": None},
                        lease,
                    )
                ],
                mark_running,
                agent=run.agent,
            )
            current = await ctx.runs.get(run.run_id) or run
            caller = await ctx.caller(current)
            ctx.launch(
                Segment(
                    run=current,
                    graph=graph,
                    agent=ctx.agent(graph),
                    start=run.input,
                    caller=caller,
                    context=graph.new_context(caller),
                    lease=lease,
                )
            )
            return True

    async def _abort_open(self, run: RunRecord, lease: Lease) -> list[NewEvent]:
        """What the stream would have ended had it not been cut: `message.aborted` for every
        message of the run that started and never ended, and `reasoning.completed` (`aborted`,
        with the summary streamed so far) for every reasoning summary, as a stop ends them."""
        records = await self._ctx.events.for_run(
            run.thread_id,
            run.run_id,
            (
                EventType.MESSAGE_STARTED,
                EventType.MESSAGE_COMPLETED,
                EventType.MESSAGE_ABORTED,
                REASONING_STARTED,
                REASONING_DELTA,
                REASONING_COMPLETED,
            ),
        )
        open_messages: dict[str, None] = {}
        open_reasonings: dict[str, list[str]] = {}
        for record in records:
            data = orjson.loads(record.data)
            if record.type == EventType.MESSAGE_STARTED:
                open_messages[data.get("message_id")] = None
            elif record.type == REASONING_STARTED:
                open_reasonings[data.get("reasoning_id")] = []
            elif record.type == REASONING_DELTA:
                open_reasonings.get(data.get("reasoning_id"), []).append(data.get("delta", ""))
            elif record.type == REASONING_COMPLETED:
                open_reasonings.pop(data.get("reasoning_id"), None)
            else:
                open_messages.pop(data.get("message_id"), None)
        ended: list[tuple[str, dict[str, Any]]] = [
            (
                REASONING_COMPLETED,
                {"reasoning_id": reasoning_id, "text": "".join(parts), "aborted": True},
            )
            for reasoning_id, parts in open_reasonings.items()
        ]
        ended += [
            (EventType.MESSAGE_ABORTED, {"message_id": message_id, "reason": "gateway_restart"})
            for message_id in open_messages
        ]
        return [
            self._ctx.log.new_event(run.thread_id, run.run_id, type_, data, lease)
            for type_, data in ended
        ]
