"""The bodies an AG-UI client posts (docs/protocol.md §12): a `RunAgentInput`, and the
entries of its `resume` that answer the gateway's interrupts."""

from __future__ import annotations

from typing import Any


def run_input(thread_id: str, run_id: str, text: str | None = None, **extra: Any) -> dict[str, Any]:
    """A run of `thread_id` with `text` as its user message (none without); `extra` adds or
    replaces fields (`resume=[...]`)."""
    messages = [] if text is None else [{"id": f"u-{run_id}", "role": "user", "content": text}]
    return {
        "threadId": thread_id,
        "runId": run_id,
        "protocolVersion": "1.0",
        "state": {},
        "messages": messages,
        "tools": [],
        "context": [],
        "forwardedProps": {},
        **extra,
    }


def resolved(interrupt_id: str, **payload: Any) -> dict[str, Any]:
    """A `resume` entry answering the interrupt `interrupt_id` with `payload` (`approved`,
    `editedArgs`, ...)."""
    return {"interruptId": interrupt_id, "status": "resolved", "payload": payload}
