"""A hello's token check (docs/protocol.md §3), told to the connection's session as an event:
the verifier's answer, with rejected tokens in the audit trail."""

from __future__ import annotations

from gateway.auth.access import AuthError, AuthUnavailable
from gateway.auth.audit_trail import Transport
from gateway.protocol.session import Authenticated, AuthenticationFailed
from gateway.resources import Services


async def check_hello_token(
    services: Services, token: str, *, source: str | None
) -> Authenticated | AuthenticationFailed:
    """`source`: the client's address, for the audit trail and the principal."""
    try:
        principal = await services.verifier.authenticate(token)
    except AuthError as exc:
        # A token that could not be checked says nothing about the caller: not audited.
        unavailable = isinstance(exc, AuthUnavailable)
        if not unavailable:
            services.audit.token_rejected(
                source=source, transport=Transport.WS, message=exc.message
            )
        return AuthenticationFailed(exc.code, exc.message, unavailable)
    return Authenticated(principal)
