"""A caller's bearer token, checked, and the refusals the audit trail records for it
(docs/protocol.md "`GET /v1/audit`"): `auth.token_rejected` for a token that fails verification,
`access.denied` for a `forbidden` or `not_found` answer to a caller whose token passed. The HTTP
routes and the AI SDK's WebSocket, whose frames each carry a token, go through these, so both
leave the same trail."""

from __future__ import annotations

import dataclasses

from gateway.auth.access import AuthError, AuthUnavailable
from gateway.auth.audit_trail import DENIAL_CODES, Transport
from gateway.protocol.error_codes import ErrorCode, GatewayError
from gateway.protocol.identity import Principal
from gateway.resources import Services


async def verify_bearer(
    services: Services, authorization: str, *, source: str | None, transport: Transport
) -> Principal:
    """The caller an `Authorization` value (`Bearer <JWT>`) names, from `source` (the peer's
    address); raises `unauthorized` (or `unavailable` without the JWKS)."""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        message = "missing bearer token"
        services.audit.token_rejected(source=source, transport=transport, message=message)
        raise GatewayError(ErrorCode.UNAUTHORIZED, message)
    try:
        # Every request is verified afresh, so an expired token stops working at once.
        principal = await services.verifier.authenticate(token.strip())
    except AuthError as exc:
        # A token that could not be checked says nothing about the caller: not audited.
        if not isinstance(exc, AuthUnavailable):
            services.audit.token_rejected(source=source, transport=transport, message=exc.message)
        raise
    return dataclasses.replace(principal, source=source)


def note_denial(
    services: Services,
    principal: Principal | None,
    error: GatewayError,
    *,
    operation: str,
    target: str | None,
    transport: Transport,
) -> None:
    """Audit `error` when it refuses an authenticated caller (`forbidden` / `not_found`)."""
    if error.code not in DENIAL_CODES or principal is None:
        return
    services.audit.access_denied(
        principal, code=error.code, operation=operation, target=target, transport=transport
    )
