"""SDK stream events -> protocol events (docs/protocol.md §6).

One translator per streamed segment of a run. Message ids are minted by the gateway (model item
ids repeat across responses and providers), so they are stable for clients across replays.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agents import AgentUpdatedStreamEvent, RawResponsesStreamEvent, RunItemStreamEvent

from gateway.protocol.frames import (
    MODEL_USAGE,
    REASONING_COMPLETED,
    REASONING_DELTA,
    REASONING_STARTED,
    EventType,
)
from gateway.run_lifecycle.sensitive_arguments import SensitiveArguments, masked_call_data
from persistence.ids import new_id

Emitted = tuple[str, dict[str, Any]]


def parse_arguments(raw: Any) -> dict[str, Any]:
    """Tool arguments as a JSON object; anything else is kept verbatim under `_raw`."""
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return {"_raw": raw}
        return value if isinstance(value, dict) else {"_raw": raw}
    return {} if raw is None else {"_raw": str(raw)}


def output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    try:
        return json.dumps(output, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(output)


@dataclass
class StreamTranslator:
    agent: str
    # call_id -> tool name, seeded with the decided approvals when resuming (the resumed stream
    # carries their outputs without a second `tool_called`).
    call_names: dict[str, str] = field(default_factory=dict)
    # call ids whose output is already logged: a recovered run replays their turn
    skip_outputs: set[str] = field(default_factory=set)
    # model item id -> (gateway message id, text so far), for messages of the current response
    open_messages: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    # the same for reasoning summaries
    open_reasonings: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    # the graph's sensitive arguments, masked in `tool.called`
    # (gateway/run_lifecycle/sensitive_arguments.py)
    sensitive: SensitiveArguments = field(default_factory=dict)

    def translate(self, event: Any) -> list[Emitted]:
        if isinstance(event, RawResponsesStreamEvent):
            return self._raw(event.data)
        if isinstance(event, RunItemStreamEvent):
            return self._item(event)
        if isinstance(event, AgentUpdatedStreamEvent):
            name = event.new_agent.name
            if name != self.agent:
                self.agent = name
                return [(EventType.AGENT_CHANGED, {"agent": name})]
        return []

    def abort_open(self, reason: str) -> list[Emitted]:
        """`message.aborted` for every message that started and will never complete.

        Pure, so a final write retried while storage is down announces the same aborts.
        """
        aborted: list[Emitted] = [
            (
                REASONING_COMPLETED,
                {"reasoning_id": reasoning_id, "text": "".join(parts), "aborted": True},
            )
            for reasoning_id, parts in self.open_reasonings.values()
        ]
        # A stop keeps what was streamed (docs/protocol.md §6 `message.aborted`): the event
        # carries it, and the run lifecycle adds it to the conversation's history.
        keep = reason == "cancelled"
        return aborted + [
            (
                EventType.MESSAGE_ABORTED,
                {"message_id": message_id, "reason": reason, "text": "".join(parts)}
                if keep
                else {"message_id": message_id, "reason": reason},
            )
            for message_id, parts in self.open_messages.values()
        ]

    def stopped_texts(self) -> list[str]:
        """The text each open message streamed so far, for a stop that keeps it."""
        return [text for _, parts in self.open_messages.values() if (text := "".join(parts))]

    def _raw(self, data: Any) -> list[Emitted]:
        kind = getattr(data, "type", None)
        if kind == "response.output_text.delta":
            entry = self.open_messages.get(getattr(data, "item_id", ""))
            delta = getattr(data, "delta", "")
            if entry is None or not delta:
                return []
            entry[1].append(delta)
            return [(EventType.MESSAGE_DELTA, {"message_id": entry[0], "delta": delta})]
        if kind == "response.output_item.added":
            item = data.item
            item_type = getattr(item, "type", None)
            if item_type == "reasoning":
                reasoning_id = new_id("m")
                self.open_reasonings[item.id] = (reasoning_id, [])
                return [(REASONING_STARTED, {"reasoning_id": reasoning_id, "agent": self.agent})]
            if item_type != "message":
                return []
            message_id = new_id("m")
            self.open_messages[item.id] = (message_id, [])
            return [(EventType.MESSAGE_STARTED, {"message_id": message_id, "agent": self.agent})]
        if kind == "response.output_item.done":
            item = data.item
            item_type = getattr(item, "type", None)
            if item_type == "reasoning":
                return self._reasoning_done(item)
            if item_type != "message":
                return []
            entry = self.open_messages.pop(item.id, None)
            if entry is None:
                return []
            message_id, parts = entry
            text = _message_text(item) or "".join(parts)
            return [(EventType.MESSAGE_COMPLETED, {"message_id": message_id, "text": text})]
        if kind in (
            "response.reasoning_summary_text.delta",
            "response.reasoning_summary_part.added",
        ):
            return self._reasoning_delta(kind, data)
        if kind == "response.completed":
            usage = getattr(getattr(data, "response", None), "usage", None)
            counts = usage_counts(usage) if usage is not None else {}
            if not counts.get("total_tokens") and not counts.get("input_tokens"):
                # A provider that reports no usage (or a scripted model's empty one).
                return []
            model = getattr(data.response, "model", None)
            return [
                (
                    MODEL_USAGE,
                    {
                        "agent": self.agent,
                        **({"model": model} if isinstance(model, str) and model else {}),
                        **counts,
                    },
                )
            ]
        return []

    def _reasoning_delta(self, kind: str, data: Any) -> list[Emitted]:
        entry = self.open_reasonings.get(getattr(data, "item_id", ""))
        if entry is None:
            return []
        if kind == "response.reasoning_summary_part.added":
            # A summary comes in parts; later parts start a new paragraph.
            delta = "\n\n" if entry[1] else ""
        else:
            delta = getattr(data, "delta", "")
        if not delta:
            return []
        entry[1].append(delta)
        return [(REASONING_DELTA, {"reasoning_id": entry[0], "delta": delta})]

    def _reasoning_done(self, item: Any) -> list[Emitted]:
        entry = self.open_reasonings.pop(getattr(item, "id", ""), None)
        if entry is None:
            return []
        reasoning_id, parts = entry
        return [(REASONING_COMPLETED, {"reasoning_id": reasoning_id, "text": "".join(parts)})]

    def _item(self, event: RunItemStreamEvent) -> list[Emitted]:
        item = event.item
        if event.name == "tool_called":
            raw = item.raw_item
            call_id = _field(raw, "call_id") or _field(raw, "id") or ""
            name = _field(raw, "name") or getattr(item, "tool_name", None) or "tool"
            self.call_names[call_id] = name
            agent = getattr(getattr(item, "agent", None), "name", self.agent)
            data = {
                "call_id": call_id,
                "tool_name": name,
                "arguments": parse_arguments(_field(raw, "arguments")),
                "agent": agent,
            }
            return [(EventType.TOOL_CALLED, masked_call_data(data, name, self.sensitive))]
        if event.name == "tool_output":
            call_id = getattr(item, "call_id", None) or _field(item.raw_item, "call_id") or ""
            if call_id in self.skip_outputs:
                return []
            return [
                (
                    EventType.TOOL_OUTPUT,
                    {
                        "call_id": call_id,
                        "tool_name": self.call_names.get(call_id, "tool"),
                        "output": output_text(item.output),
                    },
                )
            ]
        return []


def usage_counts(usage: Any) -> dict[str, int]:
    """The token counts of an SDK or Responses API usage object (docs/protocol.md §6)."""
    inputs = getattr(usage, "input_tokens_details", None)
    outputs = getattr(usage, "output_tokens_details", None)
    counts = {
        "input_tokens": int(getattr(usage, "input_tokens", 0) or 0),
        "output_tokens": int(getattr(usage, "output_tokens", 0) or 0),
        "total_tokens": int(getattr(usage, "total_tokens", 0) or 0),
        "cached_tokens": int(getattr(inputs, "cached_tokens", 0) or 0),
        "reasoning_tokens": int(getattr(outputs, "reasoning_tokens", 0) or 0),
    }
    return counts


def _field(raw: Any, name: str) -> Any:
    if isinstance(raw, Mapping):
        return raw.get(name)
    return getattr(raw, name, None)


def _message_text(item: Any) -> str:
    parts = []
    for content in getattr(item, "content", None) or []:
        text = getattr(content, "text", None)
        if text is None:
            text = getattr(content, "refusal", None)
        if text:
            parts.append(text)
    return "".join(parts)
