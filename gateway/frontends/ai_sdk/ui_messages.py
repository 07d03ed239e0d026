"""A chat's past as `UIMessage`s, so `useChat({messages})` starts from the server's truth.

Each run is two messages: the user's input, and the assistant message the run's chunks build
(gateway/frontends/ai_sdk/ui_chunks.py), folded here the way the AI SDK folds them in the
browser: text parts, tool parts in their latest state (with the approval and its answer), data
parts, and the message metadata (`threadId`, `runId`, the last `seq`, the run's status).
"""

from __future__ import annotations

from typing import Any

from gateway.frontends.ai_sdk.chat_requests import INPUT_SUFFIX
from gateway.frontends.ai_sdk.ui_chunks import Chunk, RunChunks

Part = dict[str, Any]


def user_message(run_id: str, text: str) -> dict[str, Any]:
    return {
        "id": f"{run_id}{INPUT_SUFFIX}",
        "role": "user",
        "parts": [{"type": "text", "text": text}],
    }


class MessageFold:
    """An assistant message built chunk by chunk."""

    def __init__(self, message_id: str) -> None:
        self.message: dict[str, Any] = {"id": message_id, "role": "assistant", "parts": []}
        self._texts: dict[str, Part] = {}
        self._tools: dict[str, Part] = {}
        self._by_approval: dict[str, Part] = {}

    def add(self, chunk: Chunk) -> None:
        kind = chunk["type"]
        parts: list[Part] = self.message["parts"]
        if "messageMetadata" in chunk and chunk["messageMetadata"] is not None:
            self.message["metadata"] = {
                **self.message.get("metadata", {}),
                **chunk["messageMetadata"],
            }
        if kind == "start-step":
            parts.append({"type": "step-start"})
        elif kind == "reset-step":
            # The parts since the step's start go (the AI SDK keeps the step-start itself).
            starts = [i for i, part in enumerate(parts) if part["type"] == "step-start"]
            del parts[(starts[-1] + 1 if starts else 0) :]
        elif kind in ("text-start", "reasoning-start"):
            part = {"type": kind.removesuffix("-start"), "text": "", "state": "streaming"}
            self._texts[chunk["id"]] = part
            parts.append(part)
        elif kind in ("text-delta", "reasoning-delta"):
            self._texts[chunk["id"]]["text"] += chunk["delta"]
        elif kind in ("text-end", "reasoning-end"):
            self._texts[chunk["id"]]["state"] = "done"
        elif kind == "tool-input-available":
            part = {
                "type": f"tool-{chunk['toolName']}",
                "toolCallId": chunk["toolCallId"],
                "state": "input-available",
                "input": chunk["input"],
            }
            self._tools[chunk["toolCallId"]] = part
            parts.append(part)
        elif kind == "tool-approval-request":
            part = self._tools[chunk["toolCallId"]]
            part["state"] = "approval-requested"
            part["approval"] = {
                "id": chunk["approvalId"],
                "descriptor": chunk["approvalDescriptor"],
            }
            self._by_approval[chunk["approvalId"]] = part
        elif kind == "tool-approval-response":
            part = self._by_approval[chunk["approvalId"]]
            part["state"] = "approval-responded"
            part["approval"] = {**part["approval"], "approved": chunk["approved"]}
            if "reason" in chunk:
                part["approval"]["reason"] = chunk["reason"]
        elif kind == "tool-output-available":
            part = self._tools[chunk["toolCallId"]]
            part["state"] = "output-available"
            part["output"] = chunk["output"]
        elif kind == "tool-output-denied":
            self._tools[chunk["toolCallId"]]["state"] = "output-denied"
        elif kind.startswith("data-"):
            parts.append({"type": kind, "data": chunk["data"]})
        # start, finish, finish-step, message-metadata, abort, error: metadata at most.


def run_messages(
    projection: RunChunks, entries: list[Any], user_input: str | None
) -> list[dict[str, Any]]:
    """The user's input and the assistant message of one run, from its stored events;
    `user_input` None: the input is shown before, with the run it was first given to."""
    fold = MessageFold(projection.run_id)
    seq = entries[0].seq if entries else 0
    fold.add(projection.start(seq))
    for entry in entries:
        step = projection.feed(entry)
        for chunk in [*step.chunks, *step.closing]:
            fold.add(chunk)
    if user_input is None:
        return [fold.message]
    return [user_message(projection.run_id, user_input), fold.message]
