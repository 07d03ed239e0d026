"""What a useChat request asks for, read from its body (HTTP) or `send` frame (WebSocket).

useChat sends the whole conversation with every request. The gateway keeps the history itself,
so only the newest message counts: a user message is the next input; an assistant message with
`approval-responded` tool parts answers the approvals it shows. Client-side state is never
trusted: an answer names an approval id, which the run lifecycle checks against the server's
own pending approvals before anything is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.frontends.conversation import Decision, conversation_id
from gateway.protocol.error_codes import ErrorCode, GatewayError

TRIGGERS = ("submit-message", "regenerate-message")
# The suffix of a user message's id in the gateway's history (ui_messages.user_message).
INPUT_SUFFIX = "-input"


@dataclass(frozen=True)
class AnsweredInput:
    """A user message to answer anew (edited, or regenerated from), named as the client's
    history names it:
    the gateway's own id (`<run id>-input`), or the client's, which only the message before it
    places: `follows`, the id of the last assistant message before it (a run's id), None when
    it is the chat's first input."""

    message_id: str
    follows: str | None

    @property
    def run_id(self) -> str | None:
        """The run whose input this is, when the id is the gateway's."""
        if self.message_id.endswith(INPUT_SUFFIX):
            return self.message_id.removesuffix(INPUT_SUFFIX)
        return None


@dataclass(frozen=True)
class ChatRequest:
    chat_id: str
    # The newest user message's text, or None when the request answers approvals.
    text: str | None
    decisions: list[Decision] = field(default_factory=list)
    # The assistant message continued (useChat's `messageId` on a follow-up).
    message_id: str | None = None
    # A new answer to the last input (`regenerate()`), or to an edited one (`sendMessage`
    # with the edited user message's id): the chat's last run is superseded.
    regenerate: bool = False
    # The run whose answer is replaced, when the request names its answer.
    supersedes: str | None = None
    # The input answered anew, when the request names a user message: only the chat's last
    # input may be (the gateway keeps one branch; an earlier turn's edit is refused).
    answered_input: AnsweredInput | None = None


def bad_request(message: str) -> GatewayError:
    return GatewayError(ErrorCode.BAD_REQUEST, message)


def chat_request(body: dict[str, Any]) -> ChatRequest:
    """The request in a useChat body (`{id, messages, trigger, messageId?, …}`)."""
    chat_id = conversation_id(body.get("id"), "id")
    trigger = body.get("trigger", "submit-message")
    if trigger not in TRIGGERS:
        raise bad_request(f"trigger must be one of {', '.join(TRIGGERS)}")
    message_id = body.get("messageId")
    if message_id is not None and not isinstance(message_id, str):
        raise bad_request("messageId must be a string")
    messages = body.get("messages")
    if trigger == "regenerate-message":
        # useChat sends the history up to the answer it regenerates, and that answer's id; or,
        # to regenerate from a user message, the history up to that message, and its id.
        history = messages if isinstance(messages, list) else []
        if message_id is not None and _names_user_message(history, message_id):
            answered = AnsweredInput(message_id, _follows(history[:-1]))
            return ChatRequest(chat_id, None, regenerate=True, answered_input=answered)
        return ChatRequest(chat_id, None, regenerate=True, supersedes=message_id)
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list")
    newest = messages[-1]
    if not isinstance(newest, dict) or not isinstance(newest.get("parts"), list):
        raise bad_request("the newest message must be an object with a list of parts")
    role = newest.get("role")
    parts = [part for part in newest["parts"] if isinstance(part, dict)]
    if role == "user":
        texts = [part.get("text") for part in parts if part.get("type") == "text"]
        if not all(isinstance(text, str) for text in texts):
            raise bad_request("a text part's text must be a string")
        text = "".join(str(t) for t in texts)
        if not text.strip():
            raise bad_request("the newest message has no text")
        if message_id is not None:
            # An edited user message: its answer is regenerated from the new text (useChat
            # sends the history up to it, the message before it telling which input it is).
            edited = AnsweredInput(message_id, _follows(messages[:-1]))
            return ChatRequest(chat_id, text, regenerate=True, answered_input=edited)
        return ChatRequest(chat_id, text)
    if role == "assistant":
        decisions = [_decision(part) for part in parts if part.get("state") == "approval-responded"]
        if not decisions:
            raise bad_request("the newest message is the assistant's and answers no approval")
        return ChatRequest(chat_id, None, decisions, message_id)
    raise bad_request("the newest message must be the user's, or the assistant's with answers")


def _names_user_message(history: list[Any], message_id: str) -> bool:
    """Whether `message_id` is a user message's: the gateway's name for one, or the newest of
    the history sent (useChat keeps the user message it regenerates from, and ends there)."""
    if message_id.endswith(INPUT_SUFFIX):
        return True
    newest = history[-1] if history else None
    return (
        isinstance(newest, dict) and newest.get("role") == "user" and newest.get("id") == message_id
    )


def _follows(earlier: list[Any]) -> str | None:
    """The id of the last assistant message in `earlier`, the history before a user message."""
    for message in reversed(earlier):
        if isinstance(message, dict) and message.get("role") == "assistant":
            message_id = message.get("id")
            return message_id if isinstance(message_id, str) else None
    return None


def _decision(part: dict[str, Any]) -> Decision:
    approval = part.get("approval")
    if not isinstance(approval, dict):
        raise bad_request("an approval-responded part must carry its approval")
    approval_id, approved = approval.get("id"), approval.get("approved")
    if not isinstance(approval_id, str) or not approval_id:
        raise bad_request("an answered approval needs its id")
    if not isinstance(approved, bool):
        raise bad_request("an answered approval's `approved` must be true or false")
    reason = approval.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise bad_request("an answered approval's reason must be a string")
    return Decision(approval_id, approved, reason or None)
