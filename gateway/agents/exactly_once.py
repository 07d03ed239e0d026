"""Side effects exactly once: the operation ledger as tool authors use it.

The SDK never saves state by itself; after a crash the newest checkpoint may still show an
approved call as not executed, and resuming runs it again (docs/architecture.md "SDK behaviours").
A tool wraps its side effect in `run_once`, keyed by the run and the SDK's `call_id`:

    @function_tool(needs_approval=True)
    async def issue_refund(ctx: ToolContext[Any], order_id: int, amount: float) -> str:
        return await run_once(
            ctx,
            lambda key: payments.refund(order_id, amount, idempotency_key=key),
            policy=Policy.RECONCILE,
        )

- first attempt: recorded "started" (durable before the operation runs), runs, recorded "done"
  with its result (or "failed"). The outcome is queued ahead of whatever the run stores next
  (the tool's output first), not waited for: a crash before it lands leaves the call "started",
  as a crash between the side effect and its record always could;
- a call already "done" returns the stored result without running again;
- a call found "started" (the process died between the side effect and its record) follows
  the tool's policy: `RERUN` for idempotent operations (the same idempotency key goes to the
  external system, which deduplicates), `RECONCILE` to tell the model and the reviewers that a
  human must check the external system (the call is not repeated).

The idempotency key is stable across retries and restarts: pass it on to the external system,
since no ledger can close the window between a side effect and its record.

Outside a gateway run (plain `Runner.run` in a notebook or a unit test) `run_once` just runs
the operation with a key derived from the call id.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gateway.protocol.error_codes import CodedError
from persistence.ledger import OperationRepository, OperationStatus

log = logging.getLogger(__name__)


class Policy(StrEnum):
    RERUN = "rerun"
    RECONCILE = "reconcile"


class OperationFailed(CodedError, RuntimeError):
    """A call that failed before is not retried; the stored error is reported again."""


@dataclass(frozen=True)
class LedgerScope:
    """What the gateway binds around a run's SDK stream (per task, through a ContextVar)."""

    scope: str  # the run id
    repository: OperationRepository
    on_reconcile: Callable[[str, str, str], Awaitable[None]]  # (call_id, tool_name, key)
    # (call_id, status, text): records a call's outcome, returning once it is queued ahead of
    # whatever the run stores next (the event log's writer), not once it is durable.
    record_outcome: Callable[[str, OperationStatus, str], Awaitable[None]]


# A ContextVar, not shared state: each run's task sees its own scope, and tool tasks the SDK
# spawns inherit it.
current_scope: ContextVar[LedgerScope | None] = ContextVar("gateway_ledger_scope", default=None)


def idempotency_key(scope: str, call_id: str) -> str:
    return "op_" + hashlib.sha256(f"{scope}:{call_id}".encode()).hexdigest()[:32]


def reconciliation_message(tool_name: str, key: str) -> str:
    return (
        f"The operation {tool_name} may or may not have taken effect: it was interrupted by a "
        f"gateway restart before its result was recorded. It was not repeated. A human must "
        f"check the external system for idempotency key {key} before trying again."
    )


async def run_once(
    ctx: Any,
    operation: Callable[[str], Any],
    *,
    policy: Policy = Policy.RECONCILE,
    tool_name: str | None = None,
) -> str:
    """Run `operation(idempotency_key)` at most once per (run, call_id); see module docs."""
    call_id = str(getattr(ctx, "tool_call_id", "") or "")
    name = tool_name or str(getattr(ctx, "tool_name", "") or "tool")
    bound = current_scope.get()
    if bound is None:
        return await _call(operation, idempotency_key("local", call_id or "unknown"))
    if not call_id:
        # The SDK hands a plain RunContextWrapper to tools that annotate their first parameter
        # that way; without the call id there is no key, and running unprotected would be
        # exactly the silent double side effect this exists to prevent.
        raise TypeError(
            "run_once needs the tool's ToolContext (annotate the tool's first parameter as "
            "agents.tool_context.ToolContext, not RunContextWrapper)"
        )
    key = idempotency_key(bound.scope, call_id)
    previous = await bound.repository.begin(bound.scope, call_id, name)
    if previous is not None:
        if previous.status is OperationStatus.DONE:
            return previous.result or ""
        if previous.status is OperationStatus.FAILED:
            raise OperationFailed(previous.result or f"{name} failed before")
        if previous.status is OperationStatus.NEEDS_RECONCILIATION or policy is Policy.RECONCILE:
            message = reconciliation_message(name, key)
            await bound.record_outcome(call_id, OperationStatus.NEEDS_RECONCILIATION, message)
            log.warning("operation %s (%s) needs reconciliation", name, call_id)
            await bound.on_reconcile(call_id, name, key)
            return message
        log.info("re-running idempotent operation %s (%s) after a restart", name, call_id)
    try:
        text = await _call(operation, key)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:2000]
        await bound.record_outcome(call_id, OperationStatus.FAILED, error)
        raise
    await bound.record_outcome(call_id, OperationStatus.DONE, text)
    return text


async def _call(operation: Callable[[str], Any], key: str) -> str:
    """The operation's result as the ledger stores it (text), with a ledger or without, so a
    tool sees the same value either way and a replay returns what the first call did."""
    result = operation(key)
    if inspect.isawaitable(result):
        result = await result
    return result if isinstance(result, str) else str(result)
