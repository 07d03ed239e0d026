"""`runs cancel`: cancelling a run from outside every gateway process.

The command is one more process on the database, and cancels exactly as a gateway process
that does not stream the run (`gateway.run_lifecycle.cancellation.cancel_unstreamed`):
`run.cancelled` at the thread's next seq, in the transaction that moves the run, revokes its lease
and supersedes its approvals. With `GATEWAY_BUS_URL=redis://…` it also tells the gateways at once
(their subscribers read the new event, the inbox loses the approvals); otherwise their log watch
finds the event within `GATEWAY_LOG_WATCH_INTERVAL_S`. The cancel is counted in
`gateway_runs_total{state="cancelled"}` by the first gateway process to claim it, at its next
lease scan or start-up (gateway/run_lifecycle/uncounted_cancels.py).

A run whose lease is live is being streamed by that process right now. It is left alone
unless forced: `run.cancel` received by that process cuts the stream at once and starts the
thread's next queued input; from here, the lease is revoked, nothing the process writes for
the run is stored any more, and it stops the run at its next lease renewal (at once over a
shared bus); a tool call in progress there goes on until then.
"""

from __future__ import annotations

import getpass
import os
import socket
from dataclasses import dataclass

from gateway.auth.audit_trail import cancellation_entry
from gateway.event_log.bus import EventBus
from gateway.event_log.relay import open_relay
from gateway.event_log.writer import EventLog
from gateway.protocol.identity import Principal, Role
from gateway.run_lifecycle.cancellation import cancel_unstreamed
from gateway.settings import Settings
from persistence.inputs import Disposition, InputRepository
from persistence.runs import RunRecord
from persistence.store import Store


@dataclass(frozen=True)
class Cancelled:
    superseded: list[str]  # the approvals the cancel took out of the inbox
    queued_inputs: int  # inputs still queued on the thread, which the command does not start


def operator_principal(tenant: str, actor: str | None) -> Principal:
    """Who the audit trail records: the operator's login unless named, from this host."""
    if actor is None:
        try:
            actor = f"operator:{getpass.getuser()}"
        except (KeyError, OSError):  # no name for the uid (a bare container)
            actor = f"operator:uid-{os.getuid()}"
    return Principal(
        user=actor,
        tenant=tenant,
        roles=frozenset({Role.ADMIN}),
        source=f"cli@{socket.gethostname()}",
    )


async def cancel_run(
    store: Store, settings: Settings, run: RunRecord, *, force: bool, actor: str | None
) -> Cancelled:
    """Raises `HeldElsewhere` unless `force`, when a process streams the run; `StaleWrite`
    when the run ended or moved meanwhile."""
    instance_id = f"operator-cli/{socket.gethostname()}/{os.getpid()}"
    bus = EventBus(
        open_relay(settings.bus_url, prefix=settings.bus_prefix, instance_id=instance_id)
    )
    log = EventLog(store, bus)
    await bus.start()
    await log.start()
    try:
        entry = cancellation_entry(
            operator_principal(run.tenant, actor),
            run_id=run.run_id,
            thread_id=run.thread_id,
            status=run.status.value,
        )
        # This process counts no metrics: a gateway process counts the cancel.
        superseded = await cancel_unstreamed(
            log, bus, run, entry, spare_live_lease=not force, counted_here=False
        )
    finally:
        await log.close()
        # Waits (briefly) for the relay's messages to go out.
        await bus.close()
    queued = await InputRepository(store).open(
        thread_id=run.thread_id, disposition=Disposition.QUEUED
    )
    return Cancelled(superseded, len(queued))
