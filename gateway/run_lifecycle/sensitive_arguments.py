"""Sensitive tool arguments: masked wherever they would reach people who need not see them.

An agent graph names, per tool, the top-level arguments that are sensitive
(`AgentGraph.sensitive_arguments`; `"*"` for all of them). Their values are replaced by `MASK`
in `tool.called` and `approval.requested` event data, which is what the event log stores and
what every subscriber receives, and a `masked` list names the arguments that were replaced.
Reviewers and admins decide on the real values: the approval row keeps them (and their digest),
approval views for reviewers and admins show them, and an `approval.requested` event delivered
to a reviewer or admin connection is rewritten from the approval row at send time.

`tool.output` is never masked: a tool that echoes a secret must not return it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from gateway.event_log.logged_event import LoggedEvent
from gateway.protocol.identity import Principal, Role
from persistence.approvals import ApprovalRepository

MASK = "***"
ALL_ARGUMENTS = "*"
# Arguments that were not a JSON object are kept verbatim under this key (stream_translation.py);
# their # parts cannot be told apart, so any sensitivity of the tool masks the whole text.
RAW_ARGUMENTS = "_raw"

SensitiveArguments = Mapping[str, frozenset[str]]


class _EveryArgument(Mapping[str, frozenset[str]]):
    """Every argument of every tool is sensitive: used when the graph that said which ones
    are is no longer registered, so nothing is shown by mistake."""

    def __getitem__(self, tool_name: str) -> frozenset[str]:
        return frozenset({ALL_ARGUMENTS})

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


MASK_ALL: SensitiveArguments = _EveryArgument()


def sees_sensitive_arguments(principal: Principal) -> bool:
    """Reviewers and admins decide approvals, so they see what they decide on."""
    return principal.has_any(Role.REVIEWER, Role.ADMIN)


def masked_names(tool_name: str, arguments: Any, sensitive: SensitiveArguments) -> list[str]:
    """The arguments of this call to mask, sorted; empty for the common, non-sensitive case."""
    names = sensitive.get(tool_name)
    if not names or not isinstance(arguments, Mapping):
        return []
    if isinstance(names, str):  # a lone name given where a set was expected
        names = frozenset({names})
    if ALL_ARGUMENTS in names:
        return sorted(arguments)
    return sorted(key for key in arguments if key in names or key == RAW_ARGUMENTS)


def mask_arguments(arguments: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    hidden = set(names)
    return {key: MASK if key in hidden else value for key, value in arguments.items()}


def masked_call_data(
    data: dict[str, Any], tool_name: str, sensitive: SensitiveArguments
) -> dict[str, Any]:
    """Event data (or an approval view) with its `arguments` masked and a `masked` list.

    Returned unchanged, with no `masked` field, when nothing is sensitive.
    """
    arguments = data.get("arguments")
    names = masked_names(tool_name, arguments, sensitive)
    if not names:
        return data
    assert isinstance(arguments, Mapping)
    masked = {**data, "arguments": mask_arguments(arguments, names), "masked": names}
    edited = data.get("edited_arguments")
    if isinstance(edited, Mapping):
        masked["edited_arguments"] = mask_arguments(
            edited, masked_names(tool_name, edited, sensitive)
        )
    return masked


def approval_id_of(frame: str) -> str | None:
    data = orjson.loads(frame).get("data")
    approval_id = data.get("approval_id") if isinstance(data, dict) else None
    return approval_id if isinstance(approval_id, str) else None


def revealed_frame(frame: str, arguments: Any) -> str:
    """The `event` frame of an `approval.requested` with its real arguments put back."""
    decoded = orjson.loads(frame)
    data = dict(decoded.get("data") or {})
    data["arguments"] = arguments
    data.pop("masked", None)
    decoded["data"] = data
    return orjson.dumps(decoded).decode()


async def reveal_approval_event(event: LoggedEvent, approvals: ApprovalRepository) -> str:
    """The frame to send a reviewer or admin for a masked `approval.requested`: the real
    arguments from the approval row. Unchanged if the row cannot be found."""
    approval_id = approval_id_of(event.frame)
    approval = await approvals.get(approval_id) if approval_id else None
    if approval is None or approval.thread_id != event.thread_id:
        return event.frame
    return revealed_frame(event.frame, approval.arguments)


async def frame_for(
    principal: Principal | None, event: LoggedEvent, approvals: ApprovalRepository
) -> str:
    """An event's frame as `principal` may see it: a masked `approval.requested` with the real
    arguments for reviewers and admins, every other frame as stored."""
    if principal is None or not sees_sensitive_arguments(principal):
        return event.frame
    return await reveal_approval_event(event, approvals)
