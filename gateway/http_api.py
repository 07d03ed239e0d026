"""HTTP endpoints (PROTOCOL §7): health, development tokens and the reviewer API.

Errors are `{"error": {"code", "message"}}` with the matching status; the same access rules as
the WebSocket apply, through the same RunManager calls.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from sqlalchemy import text
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.auth import AccessDenied, AuthError, Principal, Role, check_can_use_inbox
from gateway.errors import GatewayError
from gateway.eventlog_types import LoggedEvent
from gateway.execution import approval_view
from gateway.protocol import MAX_ID_CHARS, MAX_REASON_CHARS, ErrorCode, utc_ts
from gateway.services import Services
from persistence.errors import StorageUnavailable

log = logging.getLogger(__name__)

MAX_EVENTS_PAGE = 1000
MAX_BODY_BYTES = 64 * 1024


class JSONBody(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_response(code: ErrorCode | str, message: str, status: int) -> Response:
    return JSONBody({"error": {"code": str(code), "message": message}}, status_code=status)


Handler = Callable[[Request, Services], Awaitable[Response]]


def endpoint(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Map gateway errors to PROTOCOL §7 error bodies, once for every route."""

    async def wrapped(request: Request) -> Response:
        services: Services = request.app.state.services
        try:
            return await handler(request, services)
        except GatewayError as exc:
            return error_response(exc.code, exc.message, exc.http_status)
        except StorageUnavailable:
            return error_response(
                ErrorCode.UNAVAILABLE, "storage is unavailable; nothing was changed", 503
            )
        except Exception:
            log.error("%s %s failed", request.method, request.url.path, exc_info=True)
            return error_response(ErrorCode.INTERNAL, "internal error", 500)

    return wrapped


def authenticate(request: Request, services: Services) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise GatewayError(ErrorCode.UNAUTHORIZED, "missing bearer token")
    try:
        return services.verifier.verify(token.strip())
    except AuthError as exc:
        raise GatewayError(ErrorCode.UNAUTHORIZED, exc.message) from None


async def json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise GatewayError(ErrorCode.TOO_LARGE, f"body exceeds {MAX_BODY_BYTES} bytes")
    try:
        body = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError:
        raise GatewayError(ErrorCode.BAD_REQUEST, "body is not valid JSON") from None
    if not isinstance(body, dict):
        raise GatewayError(ErrorCode.BAD_REQUEST, "body must be a JSON object")
    return body


def int_param(request: Request, name: str, default: int, *, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise GatewayError(ErrorCode.BAD_REQUEST, f"{name} must be an integer") from None
    if not low <= value <= high:
        raise GatewayError(ErrorCode.BAD_REQUEST, f"{name} must be between {low} and {high}")
    return value


def path_id(request: Request, name: str) -> str:
    value = request.path_params[name]
    if not value or len(value) > MAX_ID_CHARS:
        raise GatewayError(ErrorCode.NOT_FOUND, f"{name.removesuffix('_id')} not found")
    return str(value)


# -- health -----------------------------------------------------------------------------------


async def healthz(request: Request) -> Response:
    return JSONBody({"status": "ok"})


async def readyz(request: Request) -> Response:
    services: Services = request.app.state.services
    try:
        async with services.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception as exc:
        return JSONBody({"status": "unavailable", "storage": type(exc).__name__}, status_code=503)
    return JSONBody({"status": "ready", "storage": "ok"})


# -- development tokens -----------------------------------------------------------------------


@endpoint
async def dev_token(request: Request, services: Services) -> Response:
    if not services.settings.dev_mode:
        raise GatewayError(ErrorCode.NOT_FOUND, "not found")
    body = await json_body(request)
    user, tenant, roles = body.get("user"), body.get("tenant", "demo"), body.get("roles", ["user"])
    if not isinstance(user, str) or not user.strip() or len(user) > 128:
        raise GatewayError(ErrorCode.BAD_REQUEST, "user must be a non-empty string")
    if not isinstance(tenant, str) or not tenant.strip() or len(tenant) > 128:
        raise GatewayError(ErrorCode.BAD_REQUEST, "tenant must be a non-empty string")
    known = {role.value for role in Role}
    if not isinstance(roles, list) or not all(isinstance(r, str) and r in known for r in roles):
        raise GatewayError(
            ErrorCode.BAD_REQUEST, f"roles must be a list drawn from {sorted(known)}"
        )
    token = services.verifier.issue(user.strip(), tenant.strip(), roles)
    return JSONBody({"token": token})


# -- reviewer API -----------------------------------------------------------------------------


@endpoint
async def list_approvals(request: Request, services: Services) -> Response:
    principal = authenticate(request, services)
    try:
        check_can_use_inbox(principal)
    except AccessDenied as exc:
        raise GatewayError(exc.code, exc.message) from None
    status = request.query_params.get("status", "pending")
    if status != "pending":
        raise GatewayError(ErrorCode.BAD_REQUEST, "only status=pending is supported")
    pending = await services.runs.approvals.pending_for_tenant(principal.tenant)
    return JSONBody({"approvals": [approval_view(a) for a in pending]})


@endpoint
async def decide(request: Request, services: Services) -> Response:
    principal = authenticate(request, services)
    approval_id = path_id(request, "approval_id")
    body = await json_body(request)
    decision, reason = body.get("decision"), body.get("reason")
    if decision not in ("approve", "reject"):
        raise GatewayError(ErrorCode.BAD_REQUEST, "decision must be 'approve' or 'reject'")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS):
        raise GatewayError(
            ErrorCode.BAD_REQUEST, f"reason must be a string of at most {MAX_REASON_CHARS} chars"
        )
    approval = await services.runs.decide(principal, approval_id, decision, reason)
    return JSONBody({"approval": approval_view(approval)})


@endpoint
async def thread_events(request: Request, services: Services) -> Response:
    principal = authenticate(request, services)
    thread = await services.runs.authorize_subscribe(principal, path_id(request, "thread_id"))
    after_seq = int_param(request, "after_seq", 0, low=0, high=2**62)
    limit = int_param(request, "limit", 500, low=1, high=MAX_EVENTS_PAGE)
    events = await services.log.read(thread.thread_id, after_seq=after_seq, limit=limit)
    current = await services.runs.threads.get(thread.thread_id) or thread
    return Response(
        _events_body(events, current.head_seq, current.epoch, current.truncated_seq),
        media_type="application/json",
    )


def _events_body(events: list[LoggedEvent], head_seq: int, epoch: str, truncated_seq: int) -> bytes:
    # Each event's frame is already encoded; splice them rather than decode and re-encode.
    frames = ",".join(event.frame for event in events)
    return (
        f'{{"events":[{frames}],"head_seq":{head_seq},"epoch":"{epoch}",'
        f'"truncated_seq":{truncated_seq}}}'
    ).encode()


@endpoint
async def get_run(request: Request, services: Services) -> Response:
    principal = authenticate(request, services)
    view = await services.runs.run_view(principal, path_id(request, "run_id"))
    return JSONBody({"run": view})


@endpoint
async def list_threads(request: Request, services: Services) -> Response:
    principal = authenticate(request, services)
    limit = int_param(request, "limit", 100, low=1, high=500)
    sees_tenant = principal.has_any(Role.REVIEWER, Role.VIEWER, Role.ADMIN)
    if not sees_tenant and not principal.has(Role.USER):
        raise GatewayError(ErrorCode.FORBIDDEN, "listing threads needs a role")
    threads = await services.runs.threads.list_for(
        tenant=principal.tenant, owner=None if sees_tenant else principal.user, limit=limit
    )
    return JSONBody(
        {
            "threads": [
                {
                    "thread_id": t.thread_id,
                    "owner": t.owner,
                    "created_at": utc_ts(t.created_at),
                    "metadata": t.metadata,
                    "epoch": t.epoch,
                    "head_seq": t.head_seq,
                }
                for t in threads
            ]
        }
    )


def routes() -> list[Route]:
    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/v1/dev/token", dev_token, methods=["POST"]),
        Route("/v1/approvals", list_approvals, methods=["GET"]),
        Route("/v1/approvals/{approval_id}/decision", decide, methods=["POST"]),
        Route("/v1/threads", list_threads, methods=["GET"]),
        Route("/v1/threads/{thread_id}/events", thread_events, methods=["GET"]),
        Route("/v1/runs/{run_id}", get_run, methods=["GET"]),
    ]
