"""Approval binding: a decision applies only to the exact call its reviewer was shown.

An approval row keeps the SDK `call_id` and a digest of the tool name and arguments as they were
displayed (`approval.requested`, the inbox, the HTTP API). Before a decision is recorded, and
again right before a restored state approves a call, the call is looked up by id among the
interruptions of the stored checkpoint and its digest is recomputed the same way. Any difference
(a tampered or stale row, a state that changed underneath) means the reviewer approved something
other than what would run, so the approval is refused rather than applied.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import orjson
from agents.items import ToolApprovalItem

from gateway.run_lifecycle.stream_translation import parse_arguments
from persistence.approvals import ApprovalRecord


def arguments_digest(tool_name: str, arguments: Any) -> str:
    # Sorted keys: the digest names the call's meaning, not the model's key order.
    canonical = orjson.dumps(
        {"tool": tool_name, "arguments": arguments}, option=orjson.OPT_SORT_KEYS
    )
    return hashlib.sha256(canonical).hexdigest()


def interruption_tool_name(item: ToolApprovalItem) -> str:
    return item.tool_name or item.name or "tool"


def interruption_arguments(item: ToolApprovalItem) -> dict[str, Any]:
    return parse_arguments(item.arguments)


def interruption_digest(item: ToolApprovalItem) -> str:
    """The digest of a pending call, computed exactly as when its approval was created."""
    return arguments_digest(interruption_tool_name(item), interruption_arguments(item))


def by_call_id(items: Iterable[ToolApprovalItem]) -> dict[str, ToolApprovalItem]:
    return {str(item.call_id or ""): item for item in items}


def binding_problem(approval: ApprovalRecord, item: ToolApprovalItem | None) -> str | None:
    """Why `approval` does not bind to `item` (its call in the checkpoint), or None when it does.

    Two checks: the displayed arguments still hash to the digest recorded with them (the row
    was not altered after display), and the checkpoint's call hashes to that same digest.
    """
    if item is None:
        return "its call is no longer pending in the run's checkpoint"
    if arguments_digest(approval.tool_name, approval.arguments) != approval.arguments_digest:
        return "the displayed arguments no longer match their recorded digest"
    if interruption_digest(item) != approval.arguments_digest:
        return "the call in the run's checkpoint differs from the one displayed"
    return None
