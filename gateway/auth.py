"""Who is calling (JWT verification) and what they may do (the access table of PROTOCOL §3).

Pure: no sockets, no storage. Callers load the thread's tenant and owner, wrap them in a
`ThreadRef` and ask one `check_*` function, which returns or raises `AccessDenied`.

Tenancy comes first in every check: a thread of another tenant is `not_found` for everyone,
admins included, so a probe can never learn that a thread id exists elsewhere. Within the
tenant a refusal is `forbidden`: the caller may already see the thread (reviewers and viewers
can), so hiding it would only make the error confusing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

import jwt

ALGORITHM = "HS256"
# Claim values end up in database keys and log lines; bound them.
MAX_CLAIM_CHARS = 256
# A valid token is a few hundred bytes; anything far larger is refused before any crypto.
MAX_TOKEN_CHARS = 8192
_REQUIRED_CLAIMS = ("sub", "tenant", "exp")


class Role(StrEnum):
    USER = "user"
    REVIEWER = "reviewer"
    VIEWER = "viewer"
    ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    user: str
    tenant: str
    roles: frozenset[Role]
    # Roles beyond the four of PROTOCOL §3 that agent graphs name for their tools (for example
    # `finance` for `issue_refund`); only names the verifier was told about are accepted.
    extra_roles: frozenset[str] = frozenset()

    def has(self, role: Role) -> bool:
        return role in self.roles

    def has_any(self, *roles: Role) -> bool:
        return not self.roles.isdisjoint(roles)


@dataclass(frozen=True)
class ThreadRef:
    """The two facts about a thread that every access rule needs."""

    tenant: str
    owner: str


class AuthError(Exception):
    """The caller could not be authenticated (`unauthorized`).

    The message is sent to the client, so it never contains the token or the secret.
    """

    code = "unauthorized"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


DenialCode = Literal["not_found", "forbidden"]


class AccessDenied(Exception):
    """An authenticated caller may not do this; `code` is an ErrorCode value of PROTOCOL §5."""

    def __init__(self, code: DenialCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code: DenialCode = code
        self.message = message


class TokenVerifier:
    """Verifies and (for development and tests) issues HS256 gateway tokens."""

    def __init__(
        self, secret: str, *, leeway_s: int = 30, custom_roles: Iterable[str] = ()
    ) -> None:
        if not secret:
            raise ValueError("the token secret must not be empty")
        if leeway_s < 0:
            raise ValueError(f"leeway_s must be >= 0, got {leeway_s}")
        self._secret = secret
        self._leeway_s = leeway_s
        self._custom_roles = frozenset(custom_roles) - {role.value for role in Role}

    def verify(self, token: str) -> Principal:
        if not isinstance(token, str) or not token:
            raise AuthError("token is missing")
        if len(token) > MAX_TOKEN_CHARS:
            raise AuthError("token is too long")
        try:
            claims = jwt.decode(
                token,
                self._secret,
                # Pinned: accepting the header's `alg` is how `none` and key-confusion attacks work.
                algorithms=[ALGORITHM],
                leeway=self._leeway_s,
                options={"require": list(_REQUIRED_CLAIMS)},
            )
        except jwt.ExpiredSignatureError:
            raise AuthError("token has expired") from None
        except jwt.ImmatureSignatureError:
            raise AuthError("token is not valid yet") from None
        except jwt.InvalidSignatureError:
            raise AuthError("token signature is invalid") from None
        except jwt.InvalidAlgorithmError:
            raise AuthError(f"token algorithm is not allowed (only {ALGORITHM})") from None
        except jwt.MissingRequiredClaimError as exc:
            raise AuthError(f"token is missing the {exc.claim!r} claim") from None
        except jwt.InvalidTokenError:
            # `from None`: PyJWT's messages can quote token segments.
            raise AuthError("token is invalid") from None
        roles, extra_roles = _roles_claim(claims.get("roles", []), self._custom_roles)
        return Principal(
            user=_name_claim(claims, "sub"),
            tenant=_name_claim(claims, "tenant"),
            roles=roles,
            extra_roles=extra_roles,
        )

    def issue(self, user: str, tenant: str, roles: Iterable[Role | str], ttl_s: int = 3600) -> str:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        now = int(time.time())
        try:
            core, extra = _roles_claim([str(role) for role in roles], self._custom_roles)
        except AuthError as exc:
            raise ValueError(exc.message) from None
        claims: dict[str, Any] = {
            "sub": user,
            "tenant": tenant,
            "roles": sorted([role.value for role in core] + list(extra)),
            "iat": now,
            "exp": now + ttl_s,
        }
        # Round-trip through the same checks verify() applies, so a dev token is always usable.
        _name_claim(claims, "sub")
        _name_claim(claims, "tenant")
        return jwt.encode(claims, self._secret, algorithm=ALGORITHM)


def _name_claim(claims: dict[str, Any], name: str) -> str:
    value = claims.get(name)
    if not isinstance(value, str) or not value:
        raise AuthError(f"token claim {name!r} must be a non-empty string")
    if len(value) > MAX_CLAIM_CHARS:
        raise AuthError(f"token claim {name!r} is longer than {MAX_CLAIM_CHARS} characters")
    return value


def _roles_claim(
    value: object, custom_roles: frozenset[str] = frozenset()
) -> tuple[frozenset[Role], frozenset[str]]:
    if not isinstance(value, list):
        raise AuthError("token claim 'roles' must be a list")
    roles: set[Role] = set()
    extra: set[str] = set()
    for item in value:
        if not isinstance(item, str):
            raise AuthError("token claim 'roles' must hold strings")
        if item in custom_roles:
            extra.add(item)
            continue
        try:
            roles.add(Role(item))
        except ValueError:
            # Refused rather than dropped: a typo in an issuer's role would otherwise silently
            # demote a reviewer. Clipped because the value comes from the caller.
            raise AuthError(f"token has an unknown role {item[:32]!r}") from None
    return frozenset(roles), frozenset(extra)


# --- access rules (PROTOCOL §3) ------------------------------------------------------------


def _require_same_tenant(principal: Principal, thread: ThreadRef) -> None:
    if principal.tenant != thread.tenant:
        raise AccessDenied("not_found", "thread not found")


def _is_owning_user(principal: Principal, thread: ThreadRef) -> bool:
    # Ownership alone is not enough: a user demoted to viewer keeps owning old threads but
    # must not act on them any more.
    return principal.user == thread.owner and principal.has(Role.USER)


def check_can_create(principal: Principal) -> None:
    """Creating a thread (or a run on a new thread) needs the user or admin role."""
    if not principal.has_any(Role.USER, Role.ADMIN):
        raise AccessDenied("forbidden", "creating threads needs the user or admin role")


def check_can_act_on_thread(principal: Principal, thread: ThreadRef) -> None:
    """Start a run, send input, cancel or resume a run: the owning user or an admin.

    Another tenant's thread is `not_found`. In the same tenant, a non-owning user, a reviewer
    or a viewer gets `forbidden`.
    """
    _require_same_tenant(principal, thread)
    if principal.has(Role.ADMIN) or _is_owning_user(principal, thread):
        return
    raise AccessDenied("forbidden", "only the thread's owner or an admin may do this")


def check_can_subscribe(principal: Principal, thread: ThreadRef) -> None:
    """Watch a thread: its owning user, or any reviewer, viewer or admin of the tenant.

    Another tenant's thread is `not_found`; another user's thread is `forbidden`.
    """
    _require_same_tenant(principal, thread)
    if principal.has_any(Role.REVIEWER, Role.VIEWER, Role.ADMIN):
        return
    if _is_owning_user(principal, thread):
        return
    raise AccessDenied(
        "forbidden", "only the thread's owner, a reviewer, a viewer or an admin may watch it"
    )


def check_can_decide(principal: Principal, thread: ThreadRef, *, self_approval: bool) -> None:
    """Decide an approval on a thread: a reviewer or admin of the tenant.

    The owning user may decide their own run's approvals only when `self_approval`
    (GATEWAY_SELF_APPROVAL) is on. A reviewer who also owns the thread decides as a reviewer.
    Another tenant's thread is `not_found`; everyone else in the tenant gets `forbidden`.
    """
    _require_same_tenant(principal, thread)
    if principal.has_any(Role.REVIEWER, Role.ADMIN):
        return
    if self_approval and _is_owning_user(principal, thread):
        return
    if _is_owning_user(principal, thread):
        raise AccessDenied("forbidden", "self-approval is disabled: a reviewer must decide")
    raise AccessDenied("forbidden", "deciding approvals needs the reviewer or admin role")


def check_can_use_inbox(principal: Principal) -> None:
    """The tenant-wide approval inbox: reviewers and admins."""
    if not principal.has_any(Role.REVIEWER, Role.ADMIN):
        raise AccessDenied("forbidden", "the approval inbox needs the reviewer or admin role")
