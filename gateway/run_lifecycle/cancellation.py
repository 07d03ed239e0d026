"""Cancelling a run that no task of this process streams (docs/protocol.md `run.cancel`).

A paused or suspended run, a run whose process stopped, or a run another process streams:
one transaction moves it to `cancelled`, appends `run.cancelled` at the thread's next seq,
revokes its lease, supersedes its pending approvals, drops its checkpoint and records who
cancelled it. The RunManager does this for `run.cancel` on a run it does not stream, and the
operator's `runs cancel` (gateway/operator/) does the same without a gateway, so both leave
exactly what clients and other processes expect to find. The command counts no metrics: it
leaves the cancel in the same transaction for a gateway process to count
(persistence/uncounted_cancels.py).
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from gateway.event_log.bus import EventBus
from gateway.event_log.writer import EventLog
from gateway.protocol.error_codes import CodedError
from gateway.protocol.frames import EventType
from persistence import uncounted_cancels
from persistence.approvals import ApprovalRepository
from persistence.audit import AuditEntry, AuditRepository
from persistence.checkpoints import CheckpointRepository
from persistence.errors import StaleWrite
from persistence.leases import LeaseHolder, LeaseRepository
from persistence.run_status import RunStatus
from persistence.runs import ACTIVE, RunRecord, RunRepository


class HeldElsewhere(CodedError, RuntimeError):
    """The run's lease is live: a process streams it (asked to leave such runs alone)."""

    def __init__(self, run_id: str, holder: LeaseHolder) -> None:
        super().__init__(f"run {run_id} is streamed by {holder.owner}")
        self.run_id = run_id
        self.holder = holder


async def cancel_unstreamed(
    log: EventLog,
    bus: EventBus,
    run: RunRecord,
    audit: AuditEntry,
    *,
    spare_live_lease: bool = False,
    counted_here: bool = True,
) -> list[str]:
    """Cancel `run` in storage; the ids of the approvals it superseded.

    Raises `StaleWrite` if the run is no longer active, and, with `spare_live_lease`,
    `HeldElsewhere` (nothing changed) if a process holds a live lease on it. Not
    `counted_here` (a process without metrics), the cancel is left to a gateway process to
    count.
    """

    def transition(conn: Connection) -> list[str]:
        # Checked in the transaction that cancels, with the row locked: a continuation that
        # takes the lease in between cannot slip past the check.
        holder = LeaseRepository.live_holder_in(conn, run.run_id) if spare_live_lease else None
        if holder is not None:
            raise HeldElsewhere(run.run_id, holder)
        moved = RunRepository.transition_in(conn, run.run_id, RunStatus.CANCELLED, expected=ACTIVE)
        if not moved:
            raise StaleWrite(run.run_id)
        # Streamed by another process: fenced off, so nothing it writes lands after
        # `run.cancelled`; told over the bus (below) to stop at once.
        LeaseRepository.revoke_in(conn, run.run_id)
        removed = ApprovalRepository.supersede_pending_in(conn, run.run_id)
        CheckpointRepository.drop_in(conn, run.run_id)
        AuditRepository.insert_in(conn, audit)
        if not counted_here:
            uncounted_cancels.record_in(conn, run.run_id, run.agent)
        return removed

    removed, _ = await log.commit(
        [log.new_event(run.thread_id, run.run_id, EventType.RUN_CANCELLED, {})],
        transition,
        agent=run.agent,
    )
    # The process streaming it stops at once rather than at its next (refused) write.
    bus.tell({"kind": "revoked", "run_id": run.run_id})
    if removed:
        bus.publish_inbox(run.tenant, removed=removed)
    return list(removed)
