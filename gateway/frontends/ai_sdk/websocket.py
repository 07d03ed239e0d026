"""The AI SDK's `WebSocketChatTransport` on the gateway: `/v1/ai-sdk/ws` (docs/protocol.md §11).

Client frames `send`, `resume`, `abort`; server frames `start`, `chunk`, `end`, `error`,
`no-active`, several requests multiplexed on one socket by `requestId`. Each response numbers
its chunks from 0 with no gap (the client ends the whole socket on a gap), so a resume, which
replays the active message from its start, numbers them from 0 again.

Browsers cannot set handshake headers, so the transport sends its `headers` inside each frame:
the token is read there (`authorization: Bearer …`), or from the handshake's `Authorization`
header for other clients. The origins are the native endpoint's, through the same `OriginGate`.
A socket that has sent no request with a valid token within `GATEWAY_HELLO_TIMEOUT_S` is closed
with `CloseCode.UNAUTHORIZED`, as `/v1/ws` closes one without a hello: an open socket costs the
gateway, and one nobody authenticated on must not hold it. Each streaming response holds one of
its user's open-connection slots, as an HTTP stream does (gateway/frontends/ai_sdk/responses.py).
A bad frame is answered with an `error` for its request, and so is a request the gateway fails
on (`internal error`, with the traceback in the log); a frame without a request id cannot
be answered (the client would end the socket on an unaddressed frame) and is only logged.
Closing the socket never stops a run; `abort` does (the gateway's cancel, across processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway.auth.audit_trail import Transport
from gateway.frontends import conversation
from gateway.frontends.ai_sdk import responses
from gateway.frontends.ai_sdk.chat_requests import chat_request
from gateway.protocol.close_codes import CloseCode
from gateway.protocol.error_codes import ErrorCode, GatewayError
from gateway.protocol.identity import Principal
from gateway.resources import Services
from gateway.transport.bearer import note_denial, verify_bearer
from gateway.transport.client_errors import INTERNAL, client_error
from gateway.transport.origin import OriginGate

log = logging.getLogger(__name__)

# Requests one socket may have streaming at once (a chat has one active response; a few tabs'
# worth of chats share a socket at most).
MAX_ACTIVE_REQUESTS = 16
MAX_REQUEST_ID_CHARS = 128


@dataclasses.dataclass
class _Request:
    chat_id: str
    principal: Principal
    task: asyncio.Task[None]


class ChatSocket:
    def __init__(self, origins: OriginGate) -> None:
        self._origins = origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        websocket = WebSocket(scope, receive=receive, send=send)
        services: Services = websocket.app.state.services
        if not await self._origins.admit(websocket, services.settings):
            return
        await websocket.accept()
        await _Session(websocket, services).serve()


class _Session:
    def __init__(self, websocket: WebSocket, services: Services) -> None:
        self._ws = websocket
        self._services = services
        self._outbox: asyncio.Queue[str] = asyncio.Queue(maxsize=services.settings.send_queue_size)
        self._requests: dict[str, _Request] = {}
        self._closed = asyncio.Event()
        # Whether a request has come with a valid token (until then the socket is on notice).
        self._authenticated = False

    async def serve(self) -> None:
        writer = asyncio.create_task(self._write(), name="ai-sdk-ws-writer")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._services.settings.hello_timeout_s
        try:
            while not self._closed.is_set():
                try:
                    async with asyncio.timeout_at(None if self._authenticated else deadline):
                        message = await self._ws.receive()
                except TimeoutError:
                    log.info("AI SDK socket: no request with a valid token within the timeout")
                    with contextlib.suppress(Exception):
                        await self._ws.close(
                            code=CloseCode.UNAUTHORIZED,
                            reason="no request with a valid token within the timeout",
                        )
                    break
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is None:
                    log.info("AI SDK socket: a binary frame was ignored")
                    continue
                await self._handle(text)
        except WebSocketDisconnect:
            pass
        finally:
            self._closed.set()
            # The responses end with the socket; the runs do not.
            for request in list(self._requests.values()):
                request.task.cancel()
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writer

    async def _write(self) -> None:
        try:
            while True:
                frame = await self._outbox.get()
                await self._ws.send_text(frame)
        except Exception:
            # The socket is gone: the reader sees the disconnect.
            self._closed.set()

    async def _send(self, frame: dict[str, Any]) -> None:
        """Queue a frame; a client that reads too slowly for `GATEWAY_SEND_TIMEOUT_S` is
        closed (`too_slow`, as on the native endpoint) and resumes."""
        encoded = orjson.dumps(frame).decode()
        if not self._outbox.full():
            self._outbox.put_nowait(encoded)
            return
        try:
            await asyncio.wait_for(
                self._outbox.put(encoded), self._services.settings.send_timeout_s
            )
        except TimeoutError:
            self._closed.set()
            with contextlib.suppress(Exception):
                await self._ws.close(code=CloseCode.TOO_SLOW)
            raise asyncio.CancelledError() from None

    async def _error(self, request_id: str, message: str) -> None:
        await self._send({"type": "error", "requestId": request_id, "errorText": message})

    async def _handle(self, text: str) -> None:
        try:
            frame = orjson.loads(text)
        except orjson.JSONDecodeError:
            log.info("AI SDK socket: a frame that is not JSON was ignored")
            return
        request_id = frame.get("requestId") if isinstance(frame, dict) else None
        if not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_REQUEST_ID_CHARS:
            log.info("AI SDK socket: a frame without a valid requestId was ignored")
            return
        kind = frame.get("type")
        if kind == "abort":
            self._abort(request_id)
            return
        if kind not in ("send", "resume"):
            await self._error(request_id, f"unknown request type {str(kind)[:40]!r}")
            return
        if request_id in self._requests:
            await self._error(request_id, "a request with this requestId is already active")
            return
        if len(self._requests) >= MAX_ACTIVE_REQUESTS:
            await self._error(
                request_id, f"this socket already has {MAX_ACTIVE_REQUESTS} active requests"
            )
            return
        principal = None
        try:
            principal = await self._principal(frame)
            chat_id = conversation.conversation_id(frame.get("id"), "id")
        except Exception as exc:
            await self._refuse(request_id, exc, kind, frame, principal)
            return
        task = asyncio.create_task(
            self._serve_request(request_id, kind, frame, principal), name="ai-sdk-ws-request"
        )
        self._requests[request_id] = _Request(chat_id, principal, task)
        task.add_done_callback(lambda _t: self._requests.pop(request_id, None))

    async def _principal(self, frame: dict[str, Any]) -> Principal:
        headers = frame.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise GatewayError(ErrorCode.BAD_REQUEST, "headers must be an object of strings")
        authorization = next(
            (v for k, v in headers.items() if k.lower() == "authorization"),
            self._ws.headers.get("authorization", ""),
        )
        client = self._ws.client
        # Refused (`unauthorized`, or `unavailable` without the JWKS) as the HTTP routes refuse,
        # with the same record in the audit trail.
        principal = await verify_bearer(
            self._services,
            authorization,
            source=client.host if client else None,
            transport=Transport.WS,
        )
        self._authenticated = True
        return principal

    async def _refuse(
        self,
        request_id: str,
        exc: Exception,
        kind: str,
        frame: dict[str, Any],
        principal: Principal | None,
    ) -> None:
        """Answer a request that failed with `exc`, so the client's request ends: refusals are
        audited as the HTTP routes audit them (`access.denied`, its operation
        `ai-sdk.<frame type>`, its target the chat id); a fault of the gateway's own is logged
        and answered `internal error`, as over HTTP."""
        error = client_error(exc)
        if error is None:
            log.error("AI SDK socket: a %s request failed", kind, exc_info=exc)
            error = INTERNAL
        chat_id = frame.get("id")
        note_denial(
            self._services,
            principal,
            error,
            operation=f"ai-sdk.{kind}",
            target=chat_id if isinstance(chat_id, str) else None,
            transport=Transport.WS,
        )
        await self._error(request_id, f"{error.code}: {error.message}")

    def _abort(self, request_id: str) -> None:
        request = self._requests.get(request_id)
        if request is None:
            return
        request.task.cancel()
        # stop(): the run is cancelled wherever it streams; the client already closed its
        # stream, so nothing more is sent for this request.
        asyncio.create_task(self._stop(request), name="ai-sdk-ws-abort")  # noqa: RUF006

    async def _stop(self, request: _Request) -> None:
        try:
            await conversation.stop(self._services, request.principal, request.chat_id)
        except GatewayError as exc:
            if exc.fault:
                raise
            log.info("AI SDK socket: abort could not cancel the run: %s", exc)

    async def _serve_request(
        self, request_id: str, kind: str, frame: dict[str, Any], principal: Principal
    ) -> None:
        services = self._services
        try:
            if kind == "send":
                response = await responses.respond(services, principal, chat_request(frame))
            else:
                found = await responses.resume(services, principal, frame["id"])
                if found is None:
                    await self._send({"type": "no-active", "requestId": request_id})
                    return
                response = found
        except Exception as exc:
            await self._refuse(request_id, exc, kind, frame, principal)
            return
        try:
            await self._stream(request_id, kind, principal, response)
        except Exception as exc:
            # A fault once the response streams: its `error` ends the request (the transport
            # ignores the request's later frames), and the client may resume.
            await self._refuse(request_id, exc, kind, frame, principal)
        finally:
            response.slot.release()

    async def _stream(
        self, request_id: str, kind: str, principal: Principal, response: responses.ChatResponse
    ) -> None:
        if kind == "resume":
            await self._send({"type": "start", "requestId": request_id})
        sequence = 0
        async for batch in responses.paced(self._services, principal, response.chunks):
            for chunk in batch or ():
                await self._send(
                    {"type": "chunk", "requestId": request_id, "sequence": sequence, "chunk": chunk}
                )
                sequence += 1
        await self._send({"type": "end", "requestId": request_id})
