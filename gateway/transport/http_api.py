"""HTTP endpoints (docs/protocol.md §8): health, development tokens and the reviewer API.

Errors are `{"error": {"code", "message"}}` with the matching status; the same access rules as
the WebSocket apply, through the same RunManager calls.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.auth.access import check_can_use_inbox
from gateway.auth.audit_trail import AuditQuery, Transport
from gateway.event_log.logged_event import LoggedEvent
from gateway.protocol.error_codes import ERRORS, ErrorCode, GatewayError
from gateway.protocol.frames import MAX_ID_CHARS, MAX_REASON_CHARS, utc_ts
from gateway.protocol.identity import Principal, Role
from gateway.resources import Services
from gateway.storage.health import StorageUnavailable
from gateway.transport.bearer import note_denial, verify_bearer
from gateway.transport.client_errors import INTERNAL, client_error
from gateway.transport.json_body import ClientGone, read_json_body

log = logging.getLogger(__name__)

MAX_EVENTS_PAGE = 1000
MAX_AUDIT_PAGE = 500
# The widest audit column a filter can match (actor, target: 128 characters).
MAX_AUDIT_TEXT = 128
# Development token lifetimes: an hour unless asked otherwise. Short ones let clients and tests
# try out renewal before `exp`; the floor leaves a renewing client time for a round trip.
DEV_TOKEN_TTL_S = 3600
MIN_DEV_TOKEN_TTL_S = 5
MAX_DEV_TOKEN_TTL_S = 86400


class JSONBody(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_response(error: GatewayError) -> Response:
    """The error body, with the code's status; `fields` (`retry_after_s`) beside the message."""
    body = {"code": str(error.code), "message": error.message, **error.fields}
    return JSONBody({"error": body}, status_code=error.http_status)


Handler = Callable[[Request, Services], Awaitable[Response]]


def endpoint(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Map gateway errors to docs/protocol.md §8 error bodies, once for every route."""

    async def wrapped(request: Request) -> Response:
        services: Services = request.app.state.services
        try:
            return await handler(request, services)
        except ClientGone:
            # The client's doing, and nothing was changed: no traceback, no ERROR to page on.
            log.info(
                "%s %s: the client left before sending its body",
                request.method,
                _route_path(request),
            )
            return Response(status_code=ERRORS[ErrorCode.BAD_REQUEST].http_status)
        except Exception as exc:
            error = client_error(exc)
            if error is None:
                log.error("%s %s failed", request.method, request.url.path, exc_info=True)
                return error_response(INTERNAL)
            _note_denial(request, services, error)
            return error_response(error)

    return wrapped


def _source(request: Request) -> str | None:
    # The peer address; uvicorn rewrites it from trusted proxies' headers when so configured.
    return request.client.host if request.client else None


def _route_path(request: Request) -> str:
    """The route's template (`/v1/runs/{run_id}`): what was called, without the caller's ids."""
    route = request.scope.get("route")
    return getattr(route, "path", None) or request.url.path


def _note_denial(request: Request, services: Services, exc: GatewayError) -> None:
    """Audit a `forbidden` / `not_found` answer to an authenticated caller."""
    note_denial(
        services,
        getattr(request.state, "principal", None),
        exc,
        operation=f"{request.method} {_route_path(request)}",
        target=next((str(v) for v in request.path_params.values()), None),
        transport=Transport.HTTP,
    )


async def authenticate(request: Request, services: Services) -> Principal:
    # `unauthorized`, or `unavailable` when a JWKS could not be fetched.
    principal = await verify_bearer(
        services,
        request.headers.get("authorization", ""),
        source=_source(request),
        transport=Transport.HTTP,
    )
    # For the error mapping in `endpoint`, which audits refusals of this caller.
    request.state.principal = principal
    return principal


def int_param(request: Request, name: str, default: int, *, low: int, high: int) -> int:
    return int_value(name, request.query_params.get(name), default, low=low, high=high)


def int_value(name: str, raw: str | None, default: int, *, low: int, high: int) -> int:
    """A query parameter's or header's integer, or `bad_request` naming it."""
    if raw is None:
        return default
    try:
        # int() alone also reads "1_0", " 5" and non-ASCII digits: not integers to a client
        # going by the OpenAPI document, and nothing a client should come to rely on.
        if not (raw.isascii() and raw.removeprefix("-").isdigit()):
            raise ValueError(raw)
        value = int(raw)
    except ValueError:
        raise GatewayError(ErrorCode.BAD_REQUEST, f"{name} must be an integer") from None
    if not low <= value <= high:
        raise GatewayError(ErrorCode.BAD_REQUEST, f"{name} must be between {low} and {high}")
    return value


def method_route(path: str, **handlers: Callable[[Request], Awaitable[Response]]) -> Route:
    """One route for a path that several methods serve (`GET=…, PATCH=…`), so a method it does
    not serve gets 405 with an `Allow` header naming them all (a route per method would name
    only its own)."""

    async def dispatch(request: Request) -> Response:
        # The only method Starlette admits beyond the given ones is HEAD, with GET.
        return await (handlers.get(request.method) or handlers["GET"])(request)

    return Route(path, dispatch, methods=list(handlers))


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
    reason, failure = services.storage.reason, StorageUnavailable.__name__
    if reason is None:
        try:
            await services.store.ping()
        except Exception as exc:
            failure = type(exc).__name__
            reason = services.storage.reason or failure
    if reason is not None:
        # `reason`: the database's own words (storage health never quotes statements).
        return JSONBody(
            {"status": "unavailable", "storage": failure, "reason": reason},
            status_code=ERRORS[ErrorCode.UNAVAILABLE].http_status,
        )
    return JSONBody({"status": "ready", "storage": "ok"})


# -- development tokens -----------------------------------------------------------------------


@endpoint
async def dev_token(request: Request, services: Services) -> Response:
    if not services.settings.dev_mode:
        raise GatewayError(ErrorCode.NOT_FOUND, "not found")
    body = await read_json_body(request)
    user, tenant, roles = body.get("user"), body.get("tenant", "demo"), body.get("roles", ["user"])
    if not isinstance(user, str) or not user.strip() or len(user) > 128:
        raise GatewayError(ErrorCode.BAD_REQUEST, "user must be a non-empty string")
    if not isinstance(tenant, str) or not tenant.strip() or len(tenant) > 128:
        raise GatewayError(ErrorCode.BAD_REQUEST, "tenant must be a non-empty string")
    # The agent graphs' reviewer roles (e.g. `finance`) too, so per-tool rules can be tried out.
    known = {role.value for role in Role} | services.registry.reviewer_role_names()
    if not isinstance(roles, list) or not all(isinstance(r, str) and r in known for r in roles):
        raise GatewayError(
            ErrorCode.BAD_REQUEST, f"roles must be a list drawn from {sorted(known)}"
        )
    ttl_s = body.get("ttl_s", DEV_TOKEN_TTL_S)
    # JSON Schema (the OpenAPI document) counts `60.0` as an integer, so it is one here too;
    # `true` is an `int` to Python, but not a number of seconds to a client.
    if isinstance(ttl_s, float) and ttl_s.is_integer():
        ttl_s = int(ttl_s)
    if (
        isinstance(ttl_s, bool)
        or not isinstance(ttl_s, int)
        or not MIN_DEV_TOKEN_TTL_S <= ttl_s <= MAX_DEV_TOKEN_TTL_S
    ):
        raise GatewayError(
            ErrorCode.BAD_REQUEST,
            f"ttl_s must be an integer between {MIN_DEV_TOKEN_TTL_S} and "
            f"{MAX_DEV_TOKEN_TTL_S} (seconds)",
        )
    token = services.verifier.issue(user.strip(), tenant.strip(), roles, ttl_s=ttl_s)
    return JSONBody({"token": token})


async def dev_token_available(request: Request) -> Response:
    """Whether `POST /v1/dev/token` hands out tokens here: a sign-in page asks this instead of
    trying the endpoint, which answers a try with an error either way."""
    services: Services = request.app.state.services
    return JSONBody({"available": services.settings.dev_mode})


# -- reviewer API -----------------------------------------------------------------------------


@endpoint
async def list_approvals(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    check_can_use_inbox(principal)
    status = request.query_params.get("status", "pending")
    if status != "pending":
        raise GatewayError(ErrorCode.BAD_REQUEST, "only status=pending is supported")
    return JSONBody({"approvals": await services.runs.views.inbox_views(principal)})


@endpoint
async def decide(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    approval_id = path_id(request, "approval_id")
    body = await read_json_body(request)
    decision, reason = body.get("decision"), body.get("reason")
    if decision not in ("approve", "reject"):
        raise GatewayError(ErrorCode.BAD_REQUEST, "decision must be 'approve' or 'reject'")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS):
        raise GatewayError(
            ErrorCode.BAD_REQUEST, f"reason must be a string of at most {MAX_REASON_CHARS} chars"
        )
    arguments = body.get("arguments")
    if arguments is not None and not isinstance(arguments, dict):
        raise GatewayError(ErrorCode.BAD_REQUEST, "arguments must be a JSON object")
    approval = await services.runs.decisions.decide(
        principal, approval_id, decision, reason, arguments
    )
    return JSONBody({"approval": await services.runs.views.view_approval(principal, approval)})


@endpoint
async def thread_events(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    thread = await services.runs.authorize_subscribe(principal, path_id(request, "thread_id"))
    after_seq = int_param(request, "after_seq", 0, low=0, high=2**62)
    limit = int_param(request, "limit", 500, low=1, high=MAX_EVENTS_PAGE)
    events = await services.log.read(thread.thread_id, after_seq=after_seq, limit=limit)
    # Read after the events, so head_seq covers them all. Retention may have cut the log in
    # between: what it removed is not part of the answer (its truncated_seq and epoch are).
    current = await services.runs.threads.get(thread.thread_id) or thread
    if current.truncated_seq:
        events = [event for event in events if event.seq > current.truncated_seq]
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
    principal = await authenticate(request, services)
    view = await services.runs.views.run_view(principal, path_id(request, "run_id"))
    return JSONBody({"run": view})


# -- audit trail --------------------------------------------------------------------------------


@endpoint
async def list_audit(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    if not principal.has(Role.ADMIN):
        raise GatewayError(ErrorCode.FORBIDDEN, "the audit trail needs the admin role")
    records, next_after_id = await services.audit.list_entries(
        _audit_query(request, principal.tenant)
    )
    return JSONBody(
        {
            "audit": [
                {
                    "audit_id": r.audit_id,
                    "at": utc_ts(r.at),
                    "tenant": r.tenant,
                    "actor": r.actor,
                    "action": r.action,
                    "outcome": r.outcome,
                    "target": r.target,
                    "source": r.source,
                    "details": r.details,
                }
                for r in records
            ],
            "next_after_id": next_after_id,
        }
    )


def _audit_query(request: Request, tenant: str) -> AuditQuery:
    """The filters of `GET /v1/audit`; an unusable value is `bad_request`, never ignored."""
    since = _time_param(request, "since")
    until = _time_param(request, "until")
    if since is not None and until is not None and since >= until:
        raise GatewayError(ErrorCode.BAD_REQUEST, "since must be earlier than until")
    return AuditQuery(
        tenant=tenant,
        action=_text_param(request, "action", MAX_AUDIT_TEXT),
        actor=_text_param(request, "actor", MAX_AUDIT_TEXT),
        target=_text_param(request, "target", MAX_AUDIT_TEXT),
        since=since,
        until=until,
        after_id=int_param(request, "after_id", 0, low=0, high=2**62),
        limit=int_param(request, "limit", 100, low=1, high=MAX_AUDIT_PAGE),
    )


def _text_param(request: Request, name: str, max_chars: int) -> str | None:
    value = request.query_params.get(name)
    if value is None:
        return None
    if not value or len(value) > max_chars:
        raise GatewayError(
            ErrorCode.BAD_REQUEST, f"{name} must be a non-empty string of at most {max_chars} chars"
        )
    return value


def _time_param(request: Request, name: str) -> datetime | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise GatewayError(
            ErrorCode.BAD_REQUEST,
            f"{name} must be an ISO 8601 date-time such as 2026-11-29T14:08:00Z",
        ) from None
    # Without an offset the time is taken as UTC, the zone of every stored `at`.
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def routes() -> list[Route]:
    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        method_route("/v1/dev/token", GET=dev_token_available, POST=dev_token),
        Route("/v1/approvals", list_approvals, methods=["GET"]),
        Route("/v1/approvals/{approval_id}/decision", decide, methods=["POST"]),
        Route("/v1/threads/{thread_id}/events", thread_events, methods=["GET"]),
        Route("/v1/runs/{run_id}", get_run, methods=["GET"]),
        Route("/v1/audit", list_audit, methods=["GET"]),
    ]
