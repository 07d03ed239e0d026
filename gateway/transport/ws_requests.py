"""The client's requests over a connection (docs/protocol.md §4): each frame type carried out
against the run manager and the connection's watches, answered with the frame to send.

A request that fails is answered with the error frame of `failure_reply`, which also puts the
refusals of an authenticated caller in the audit trail.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gateway.auth.audit_trail import DENIAL_CODES, Transport
from gateway.protocol import frames as protocol
from gateway.protocol.error_codes import ErrorCode, GatewayError
from gateway.protocol.frames import ProtocolError
from gateway.protocol.identity import Principal
from gateway.resources import Services
from gateway.run_lifecycle.started import Started
from gateway.transport.client_errors import INTERNAL, client_error
from gateway.transport.ws_watches import Outlet, Watches

log = logging.getLogger(__name__)


class ClientRequests:
    def __init__(self, services: Services, watches: Watches, outlet: Outlet) -> None:
        self._services = services
        self._watches = watches
        self._outlet = outlet

    async def perform(self, frame: Any, principal: Principal) -> dict[str, Any] | None:
        """Carry out `frame`; the reply to send, if the request was not answered already."""
        runs, watches, outlet = self._services.runs, self._watches, self._outlet
        limits = self._services.limits
        ref = frame.id
        match frame:
            case protocol.ThreadCreate():
                thread = await runs.create_thread(principal, frame.metadata)
                return protocol.ack(ref, thread_id=thread.thread_id, epoch=thread.epoch)
            case protocol.ThreadSubscribe():
                await watches.subscribe(
                    principal, frame.thread_id, frame.after_seq, frame.epoch, ref
                )
                return None
            case protocol.ThreadUnsubscribe():
                watches.unsubscribe(frame.thread_id)
                return protocol.ack(ref, thread_id=frame.thread_id)
            case protocol.RunStart():
                started = await runs.start_run(
                    principal,
                    thread_id=frame.thread_id,
                    text=frame.input,
                    agent=frame.agent,
                    on_disconnect=frame.on_disconnect,
                    admit=self._admit_run(principal, frame.thread_id),
                )
                if ref is not None:
                    await outlet.send_or_queue(
                        protocol.ack(ref, thread_id=started.thread_id, run_id=started.run_id)
                    )
                await self._watch_started(principal, started)
                return None
            case protocol.RunInput():
                result = await runs.submit_input(
                    principal,
                    frame.thread_id,
                    frame.input,
                    admit=self._admit_run(principal, frame.thread_id),
                    max_pending=limits.pending_inputs_per_thread,
                )
                first_seq = result.pop("first_seq", None)
                if ref is not None:
                    await outlet.send_or_queue(protocol.ack(ref, **result))
                if first_seq is not None and not watches.watching(frame.thread_id):
                    await watches.subscribe(
                        principal, frame.thread_id, first_seq - 1, None, None, quiet=True
                    )
                return None
            case protocol.ApprovalDecide():
                approval = await runs.decisions.decide(
                    principal, frame.approval_id, frame.decision, frame.reason, frame.arguments
                )
                return protocol.ack(
                    ref, approval=await runs.views.view_approval(principal, approval)
                )
            case protocol.RunCancel():
                await runs.cancel(principal, frame.run_id)
                return protocol.ack(ref, run_id=frame.run_id)
            case protocol.RunResume():
                await runs.resume(principal, frame.run_id)
                return protocol.ack(ref, run_id=frame.run_id)
            case protocol.RunRegenerate() | protocol.RunRetry():
                if isinstance(frame, protocol.RunRetry):
                    started = await runs.retries.retry(
                        principal,
                        frame.run_id,
                        admit=lambda thread_id: self._admit_run(principal, thread_id)(),
                    )
                else:
                    started = await runs.regenerate(
                        principal,
                        frame.thread_id,
                        text=frame.input,
                        supersedes=frame.run_id,
                        admit=self._admit_run(principal, frame.thread_id),
                    )
                if ref is not None:
                    await outlet.send_or_queue(protocol.ack(ref, **started.answer()))
                await self._watch_started(principal, started)
                return None
            case protocol.InboxSubscribe():
                await watches.subscribe_inbox(principal, ref)
                return None
            case protocol.ThreadUpdate():
                view = await runs.thread_list.change(
                    principal, frame.thread_id, title=frame.title, archived=frame.archived
                )
                return protocol.ack(ref, thread=view)
            case protocol.ThreadDelete():
                return protocol.ack(
                    ref, **await runs.thread_list.delete(principal, frame.thread_id)
                )
            case protocol.ThreadsSubscribe():
                await watches.subscribe_threads(principal, frame.archived, ref)
                return None
        raise ProtocolError(ErrorCode.BAD_REQUEST, "unsupported frame", ref)

    async def _watch_started(self, principal: Principal, started: Started) -> None:
        """Subscribe the caller to a run it started, unless it watches the thread already.
        The run's first commit gave the thread and `run.started`: nothing to read before the
        caller sees its run begin."""
        if self._watches.watching(started.thread_id):
            return
        await self._watches.subscribe(
            principal,
            started.thread_id,
            started.first_seq - 1,
            None,
            None,
            quiet=True,
            known=started.thread,
            initial=started.events,
            quiet_since=started.quiet_since,
        )

    def _admit_run(self, principal: Principal, thread_id: str | None) -> Callable[[], None]:
        """Vets a run start once the request is valid (see `RunManager.start_run`)."""
        watches, limits = self._watches, self._services.limits

        def admit() -> None:
            # The new run's thread gets subscribed: refuse before starting what we could not
            # show. Checked first, as it costs the user nothing.
            if not watches.watching(thread_id):
                watches.check_subscription_slot()
            limits.admit_run_start(principal.tenant, principal.user)

        return admit

    def failure_reply(
        self, exc: Exception, frame: Any, principal: Principal | None
    ) -> dict[str, Any]:
        """The error frame answering a request that failed with `exc`."""
        ref: str | None = frame.id if frame is not None else None
        if isinstance(exc, ProtocolError):
            return exc.to_frame()
        error = client_error(exc)
        if error is None:
            log.error("frame handling failed", exc_info=exc)
            error = INTERNAL
        self._note_denial(principal, frame, error)
        reply = protocol.error_frame(ref, error.code, error.message)
        return reply | error.fields

    def _note_denial(self, principal: Principal | None, frame: Any, exc: GatewayError) -> None:
        """Audit a `forbidden` / `not_found` answer to an authenticated caller's frame."""
        if exc.code not in DENIAL_CODES or principal is None or frame is None:
            return
        target = next(
            (
                value
                for name in ("approval_id", "run_id", "thread_id")
                if isinstance(value := getattr(frame, name, None), str)
            ),
            None,
        )
        self._services.audit.access_denied(
            principal,
            code=exc.code,
            operation=str(getattr(frame, "type", "unknown")),
            target=target,
            transport=Transport.WS,
        )
