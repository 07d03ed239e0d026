"""The AsyncAPI 3.0 document of the WebSocket protocol (`/v1/ws`, docs/protocol.md §2-§7).

The document describes the gateway: it *receives* client frames and *sends* server frames.
Client frame payloads are generated from the models that validate them (`gateway.protocol.frames`),
server frames and event data from `gateway.specs.shapes`, close codes from `CloseCode`.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel

from gateway.protocol import frames as protocol
from gateway.protocol.close_codes import CloseCode
from gateway.protocol.frames import (
    DEFAULT_MAX_INPUT_CHARS,
    MAX_ID_CHARS,
    MAX_METADATA_BYTES,
    PROTOCOL_VERSION,
)
from gateway.specs.shapes import SERVER_FRAMES, component_schemas, error_codes, event_names

CHANNEL = "gateway"

# Client frame type -> (what it does, what the server answers besides `error`, in order).
CLIENT_FRAMES: Mapping[str, tuple[str, tuple[str, ...]]] = MappingProxyType(
    {
        "hello": (
            "Authenticate; must be the first frame, within GATEWAY_HELLO_TIMEOUT_S (default 10 s)",
            ("welcome",),
        ),
        "thread.create": ("Create an empty thread owned by the caller", ("ack",)),
        "thread.subscribe": (
            "Watch a thread: `ack`, `subscribed`, the stored events after `after_seq`, then live "
            "events",
            ("ack", "subscribed", "event"),
        ),
        "thread.unsubscribe": ("Stop watching a thread on this connection", ("ack",)),
        "run.start": (
            "Start a run (on a new thread without `thread_id`); the connection is subscribed to "
            "the thread from the run's first event",
            ("ack", "subscribed", "event"),
        ),
        "run.input": (
            "Send input wherever the thread's run stands: `started`, `staged` or `queued`",
            ("ack", "subscribed", "event"),
        ),
        "approval.decide": ("Approve or reject a pending tool call", ("ack",)),
        "run.cancel": ("Cancel a run", ("ack",)),
        "run.resume": ("Continue a suspended run", ("ack",)),
        "run.regenerate": ("A new answer to the thread's last input (or an edit of it)", ("ack",)),
        "run.retry": ("A failed run, retried from its last checkpoint in a new run", ("ack",)),
        "inbox.subscribe": (
            "The tenant's pending approvals, then updates (reviewers and admins)",
            ("ack", "inbox", "inbox.update"),
        ),
        "thread.update": (
            "Rename a thread, archive it or bring it back (its owner or an admin)",
            ("ack",),
        ),
        "thread.delete": ("Delete a thread that has no active run", ("ack",)),
        "threads.subscribe": (
            "The caller's thread list, then its changes",
            ("ack", "threads", "threads.update"),
        ),
        "ping": ("Ask for a `pong`", ("pong",)),
        "pong": ("The answer to a server `ping`; gets no answer", ()),
    }
)


def client_frame_models() -> dict[str, type[BaseModel]]:
    """Frame type -> the model `parse_client_frame` validates it with."""
    union = typing.get_args(protocol.ClientFrame)[0]
    return {model.model_fields["type"].default: model for model in typing.get_args(union)}


def server_frame_types() -> dict[str, str]:
    """Frame type -> schema name, for every frame the server sends."""
    frames = {
        str(model.model_json_schema()["properties"]["type"]["const"]): model.__name__
        for model in SERVER_FRAMES
    }
    frames["event"] = "EventFrame"
    return frames


def asyncapi_document() -> dict[str, Any]:
    clients = client_frame_models()
    servers = server_frame_types()
    schemas = component_schemas([*SERVER_FRAMES, *clients.values()])
    for model in clients.values():
        _describe_client_frame(schemas[model.__name__])

    messages: dict[str, Any] = {}
    for frame_type, model in clients.items():
        messages[_client(frame_type)] = _message(frame_type, model.__name__, "id")
    for frame_type, name in servers.items():
        messages[_server(frame_type)] = _message(frame_type, name, "ref")

    operations: dict[str, Any] = {}
    for frame_type in clients:
        # A frame type missing from CLIENT_FRAMES still gets documented; tests name it.
        summary, answered_by = CLIENT_FRAMES.get(frame_type, (frame_type, ("ack",)))
        operation: dict[str, Any] = {
            "action": "receive",
            "channel": _channel_ref(),
            "summary": summary,
            "messages": [_channel_message(_client(frame_type))],
        }
        answers = [_server(t) for t in (*answered_by, "error")]
        if answered_by:
            operation["reply"] = {
                "channel": _channel_ref(),
                "messages": [_channel_message(key) for key in answers if key in messages],
            }
        operations[f"receive.{frame_type}"] = operation
    for frame_type in servers:
        operations[f"send.{frame_type}"] = {
            "action": "send",
            "channel": _channel_ref(),
            "summary": schemas[servers[frame_type]].get("description", frame_type),
            "messages": [_channel_message(_server(frame_type))],
        }

    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "agents-ws-gateway WebSocket protocol",
            "version": str(PROTOCOL_VERSION),
            "description": (
                "Streaming agent runs, durable approvals and lossless reconnects over one "
                "WebSocket. Text frames, one JSON object each; the first client frame must be "
                "`hello`. A frame with an `id` gets one answer carrying that id as `ref`: an "
                "`ack` or an `error` (a `pong` for `ping`, a `welcome` for a later `hello`; the "
                "first `hello`'s `welcome` has no `ref`, and `pong` gets no answer). The HTTP "
                "API is described by the OpenAPI document at "
                "`/v1/openapi.json`; the prose reference is docs/protocol.md.\n\n"
                f"Events (`event` frames): {', '.join(f'`{e}`' for e in event_names())}.\n\n"
                f"Error codes: {', '.join(f'`{c}`' for c in error_codes())}."
            ),
            "license": {"name": "Apache-2.0"},
        },
        "defaultContentType": "application/json",
        "servers": {
            "development": {
                "host": "127.0.0.1:8000",
                "protocol": "ws",
                "description": "`python3 dev.py serve`; use wss behind TLS in production",
                "security": [{"$ref": "#/components/securitySchemes/helloToken"}],
            }
        },
        "channels": {
            CHANNEL: {
                "address": "/v1/ws",
                "title": "The gateway socket",
                "description": _channel_description(),
                "messages": {key: {"$ref": f"#/components/messages/{key}"} for key in messages},
                "bindings": {"ws": {"method": "GET", "bindingVersion": "0.1.0"}},
                "x-close-codes": [
                    {"code": int(code), "name": code.name.lower(), "description": code.meaning}
                    for code in CloseCode
                ],
            },
            AI_SDK_CHANNEL: _ai_sdk_channel(),
        },
        "operations": operations,
        "components": {
            "securitySchemes": {
                "helloToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "JWT",
                    "description": (
                        "The token travels in the first frame, `hello` (`token`), not in an "
                        "HTTP header: the same JWTs as the HTTP API's bearer tokens."
                    ),
                }
            },
            "messages": messages,
            "schemas": schemas,
        },
    }


AI_SDK_CHANNEL = "aiSdkChat"


def _ai_sdk_channel() -> dict[str, Any]:
    """The Vercel AI SDK's `WebSocketChatTransport` protocol (docs/protocol.md §11): its frames
    are the SDK's, described here as they go over the wire."""
    request_id = {"type": "string", "minLength": 1, "maxLength": 128}
    headers = {
        "type": "object",
        "additionalProperties": {"type": "string"},
        "description": "the transport's headers; `authorization: Bearer <JWT>` is the token",
    }

    def frame(name: str, summary: str, required: list[str], **properties: Any) -> dict[str, Any]:
        return {
            "name": name,
            "summary": summary,
            "payload": {
                "type": "object",
                "required": ["type", "requestId", *required],
                "properties": {"type": {"const": name}, "requestId": request_id, **properties},
            },
        }

    chat_id = {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS}
    messages = {
        "client.send": frame(
            "send",
            "A useChat request: a new user message, or answers to approvals",
            ["id", "trigger", "messages", "headers", "body"],
            id=chat_id,
            trigger={"enum": ["submit-message", "regenerate-message"]},
            messageId={"type": "string"},
            messages={"type": "array", "items": {"type": "object"}, "minItems": 1},
            headers=headers,
            body={"type": "object"},
        ),
        "client.resume": frame(
            "resume",
            "Replay the chat's active response from its start, then follow it",
            ["id", "headers", "body"],
            id=chat_id,
            lastSequence={"type": "integer", "minimum": 0},
            headers=headers,
            body={"type": "object"},
        ),
        "client.abort": frame("abort", "Stop: cancels the request's run", []),
        "server.start": frame("start", "A resume was accepted", []),
        "server.chunk": frame(
            "chunk",
            "One UI message chunk; `sequence` counts from 0 per response, with no gap",
            ["sequence", "chunk"],
            sequence={"type": "integer", "minimum": 0},
            chunk={"type": "object", "required": ["type"]},
        ),
        "server.end": frame("end", "The response is complete", []),
        "server.error": frame("error", "The request failed", [], errorText={"type": "string"}),
        "server.no-active": frame("no-active", "Nothing is active to resume", []),
    }
    return {
        "address": "/v1/ai-sdk/ws",
        "title": "The Vercel AI SDK's WebSocketChatTransport",
        "description": (
            "Requests multiplexed by `requestId`; the token travels in each frame's headers. "
            "Frames up to GATEWAY_FRONTEND_BODY_BYTES (default 1 MiB). See docs/protocol.md §11."
        ),
        "messages": messages,
        "bindings": {"ws": {"method": "GET", "bindingVersion": "0.1.0"}},
    }


def _channel_ref() -> dict[str, str]:
    return {"$ref": f"#/channels/{CHANNEL}"}


def _client(frame_type: str) -> str:
    return f"client.{frame_type}"


def _server(frame_type: str) -> str:
    return f"server.{frame_type}"


def _channel_message(key: str) -> dict[str, str]:
    return {"$ref": f"#/channels/{CHANNEL}/messages/{key}"}


def _message(frame_type: str, schema: str, correlation: str) -> dict[str, Any]:
    return {
        "name": frame_type,
        "title": f"`{frame_type}`",
        "payload": {"$ref": f"#/components/schemas/{schema}"},
        "correlationId": {"location": f"$message.payload#/{correlation}"},
    }


def _describe_client_frame(schema: dict[str, Any]) -> None:
    """What the validating models cannot say about themselves."""
    properties = schema.get("properties", {})
    # `type` has a default in the model (it is the union's tag) but is required on the wire.
    properties.get("type", {}).pop("default", None)
    schema["required"] = ["type", *(r for r in schema.get("required", []) if r != "type")]
    if "input" in properties:
        properties["input"].update(
            pattern=r"\S",
            description="not blank; at most GATEWAY_MAX_INPUT_CHARS characters (default "
            f"{DEFAULT_MAX_INPUT_CHARS}), longer is `too_large`",
        )
    if "metadata" in properties:
        properties["metadata"]["description"] = (
            f"at most {MAX_METADATA_BYTES} bytes once encoded as JSON, and at most 254 levels "
            "deep (what the gateway's JSON encoder can write back)"
        )
    if "id" in properties:
        properties["id"]["description"] = (
            "chosen by the client; the answer (`ack` or `error`) carries it as `ref`"
        )


def _channel_description() -> str:
    lines = [
        "Frames larger than GATEWAY_MAX_FRAME_BYTES (default 65536) close the socket with "
        f"{int(CloseCode.TOO_LARGE)}. Binary frames get `bad_request`. Validation is strict "
        '(`"5"`, `true` and `1.0` are not integers); unknown fields are ignored.',
        "",
        "Close codes:",
    ]
    lines += [f"- {int(code)} ({code.name.lower()}): {code.meaning}" for code in CloseCode]
    return "\n".join(lines)
