"""Who is calling (JWT verification) and what they may do (the access table of docs/protocol.md §3).

Pure: no sockets, no storage. Callers load the thread's tenant and owner, wrap them in a
`ThreadRef` and ask one `check_*` function, which returns or raises `AccessDenied`.

Tenancy comes first in every check: a thread of another tenant is `not_found` for everyone,
admins included, so a probe can never learn that a thread id exists elsewhere. Within the
tenant a refusal is `forbidden`: the caller may already see the thread (reviewers and viewers
can), so hiding it would only make the error confusing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

import jwt
from jwt import PyJWK
from jwt.algorithms import HMACAlgorithm
from jwt.utils import base64url_encode

from gateway.auth.claims import MISSING, ClaimMapping, claim_at
from gateway.auth.jwks import KeySource, KeysUnavailable, SigningKey
from gateway.protocol.error_codes import CodedError, ErrorCode, GatewayError
from gateway.protocol.identity import Principal, Role

# The only algorithm verified with GATEWAY_SECRET; JWKS keys pin their own (gateway/auth/jwks.py).
ALGORITHM = "HS256"
DEFAULT_LEEWAY_S = 10
# Claim values end up in database keys and log lines; bound them.
MAX_CLAIM_CHARS = 256
# A valid token is a few hundred bytes; anything far larger is refused before any crypto.
MAX_TOKEN_CHARS = 8192
# Checked by PyJWT; the user, tenant and roles are read by their claim paths
# (gateway/auth/claims.py).
_REQUIRED_CLAIMS = ("exp",)
# The layout of the gateway's own tokens (signed with the secret).
GATEWAY_LAYOUT = ClaimMapping()
# NumericDate claims (RFC 7519 §2). PyJWT reads them with `int()`, which also takes digit
# strings and booleans: checked again here, so only JSON numbers count.
_TIME_CLAIMS = ("exp", "nbf", "iat")


@dataclass(frozen=True)
class ThreadRef:
    """The two facts about a thread that every access rule needs."""

    tenant: str
    owner: str


class AuthError(CodedError):
    """The caller could not be authenticated (`unauthorized`).

    The message is sent to the client, so it never contains the token or the secret.
    """

    CODE = ErrorCode.UNAUTHORIZED


DenialCode = Literal["not_found", "forbidden"]


class AccessDenied(GatewayError):
    """An authenticated caller may not do this: `not_found` or `forbidden`."""

    def __init__(self, code: DenialCode, message: str) -> None:
        super().__init__(code, message)


class AuthUnavailable(AuthError):
    """The token could not be checked right now (the identity provider's keys could not be
    fetched); retryable, unlike `unauthorized`."""

    CODE = ErrorCode.UNAVAILABLE


class TokenVerifier:
    """Verifies gateway tokens: HS256 with the shared secret, and RS256/ES256 with the keys of
    a JWKS (`keys`) when one is configured. Issues HS256 tokens for development and tests.

    Which key checks a token never depends on the header's `alg` alone: an HS256 header is
    checked with the secret (when there is one), anything else only with the JWKS key its
    `kid` names, pinned to that key's single algorithm.
    """

    def __init__(
        self,
        secret: str | None,
        *,
        keys: KeySource | None = None,
        leeway_s: int = DEFAULT_LEEWAY_S,
        issuer: str | None = None,
        audience: str | None = None,
        custom_roles: Iterable[str] = (),
        claims: ClaimMapping = GATEWAY_LAYOUT,
        kept_claims: Iterable[str] = (),
    ) -> None:
        """`claims`: where tokens verified with the JWKS keep the user, tenant and roles.
        `kept_claims`: claim paths whose values the principal carries (for run contexts)."""
        if secret is not None and not secret:
            raise ValueError("the token secret must not be empty")
        if secret is None and keys is None:
            raise ValueError("a token secret or a JWKS is needed")
        if leeway_s < 0:
            raise ValueError(f"leeway_s must be >= 0, got {leeway_s}")
        self._secret = secret
        self._secret_key = None if secret is None else secret_key(secret)
        self._keys = keys
        self._leeway_s = leeway_s
        self._issuer = issuer or None
        self._audience = audience or None
        self._custom_roles = frozenset(custom_roles) - {role.value for role in Role}
        known = self._custom_roles | {role.value for role in Role}
        unknown = sorted(set(claims.role_map.values()) - known)
        if unknown:
            raise ValueError(
                f"the role map names roles the gateway does not know: {', '.join(unknown)} "
                f"(known: {', '.join(sorted(known))})"
            )
        self._claims = claims
        self._kept_claims = tuple(sorted(set(kept_claims)))
        required = list(_REQUIRED_CLAIMS)
        if self._issuer is not None:
            required.append("iss")
        if self._audience is not None:
            required.append("aud")
        self._required = required

    @property
    def leeway_s(self) -> int:
        return self._leeway_s

    def verify(self, token: str) -> Principal:
        """Verify with the keys at hand (the secret, a JWKS file, or already fetched keys)."""
        header = self._jwks_header(token)
        signing = None
        if header is not None:
            assert self._keys is not None
            signing = self._keys.cached(_kid(header))
        return self._decode(token, header, signing)

    async def authenticate(self, token: str) -> Principal:
        """Verify, first fetching a JWKS URL's keys when the token needs one not cached yet.

        Raises AuthUnavailable (retryable) when those keys cannot be fetched.
        """
        header = self._jwks_header(token)
        signing = None
        if header is not None:
            assert self._keys is not None
            try:
                signing = await self._keys.lookup(_kid(header))
            except KeysUnavailable as exc:
                raise AuthUnavailable(f"{exc}; try again later") from None
            if signing is None:
                # A key rotated in since the last fetch, which the refetch interval holds
                # back: retryable, with when to try, instead of `unauthorized` for good.
                wait_s = self._keys.retry_after(_issued_at(token))
                if wait_s is not None:
                    raise AuthUnavailable(
                        "token key id ('kid') is not among the identity provider's keys yet "
                        f"(they are fetched again within {math.ceil(wait_s)} s); try again then"
                    )
        return self._decode(token, header, signing)

    async def aclose(self) -> None:
        if self._keys is not None:
            await self._keys.aclose()

    def _jwks_header(self, token: str) -> dict[str, Any] | None:
        """The token's header when a JWKS key checks the token; None when the secret does.
        Without a JWKS the header is not read here: `jwt.decode` reads it anyway, and the
        second read was a quarter of a token's check."""
        _check_size(token)
        if self._keys is None:
            return None
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise AuthError("token is invalid") from None
        return header if self._secret is None or header.get("alg") != ALGORITHM else None

    def _decode(
        self, token: str, jwks_header: dict[str, Any] | None, signing: SigningKey | None
    ) -> Principal:
        if jwks_header is not None:
            if signing is None:
                raise AuthError("token key id ('kid') is not known")
            key, algorithm = signing.key, signing.algorithm
        else:
            assert self._secret_key is not None
            key, algorithm = self._secret_key, ALGORITHM
        try:
            claims = jwt.decode(
                token,
                key,
                # Pinned: accepting the header's `alg` is how `none` and key-confusion attacks work.
                algorithms=[algorithm],
                leeway=self._leeway_s,
                issuer=self._issuer,
                audience=self._audience,
                options={"require": self._required},
            )
        except jwt.ExpiredSignatureError:
            raise AuthError("token has expired") from None
        except jwt.ImmatureSignatureError:
            raise AuthError("token is not valid yet") from None
        except jwt.InvalidSignatureError:
            raise AuthError("token signature is invalid") from None
        except jwt.InvalidAlgorithmError:
            raise AuthError(f"token algorithm is not allowed (only {algorithm})") from None
        except jwt.MissingRequiredClaimError as exc:
            raise AuthError(f"token is missing the {exc.claim!r} claim") from None
        except jwt.InvalidIssuerError:
            raise AuthError("token issuer ('iss') is not accepted") from None
        except jwt.InvalidAudienceError:
            raise AuthError("token audience ('aud') is not accepted") from None
        except jwt.InvalidTokenError:
            # `from None`: PyJWT's messages can quote token segments.
            raise AuthError("token is invalid") from None
        for name in _TIME_CLAIMS:
            _time_claim(claims, name)
        layout = self._claims if signing is not None else GATEWAY_LAYOUT
        if layout.lenient_roles:
            roles, extra_roles = _roles_claim(
                layout.role_names(claim_at(claims, layout.roles)), self._custom_roles, lenient=True
            )
        else:
            raw_roles = claim_at(claims, layout.roles)
            roles, extra_roles = _roles_claim(
                [] if raw_roles is MISSING else raw_roles, self._custom_roles
            )
        return Principal(
            user=_name_claim(claims, layout.user),
            tenant=layout.fixed_tenant or _name_claim(claims, layout.tenant),
            roles=roles,
            extra_roles=extra_roles,
            expires_at=float(claims["exp"]),
            claims=_kept(claims, self._kept_claims),
        )

    def issue(
        self,
        user: str,
        tenant: str,
        roles: Iterable[Role | str],
        ttl_s: int = 3600,
        extra_claims: Mapping[str, Any] | None = None,
    ) -> str:
        if self._secret is None:
            raise ValueError("this verifier has no secret to sign tokens with")
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        now = int(time.time())
        try:
            core, extra = _roles_claim([str(role) for role in roles], self._custom_roles)
        except AuthError as exc:
            raise ValueError(exc.message) from None
        claims: dict[str, Any] = {
            **(extra_claims or {}),
            "sub": user,
            "tenant": tenant,
            "roles": sorted([role.value for role in core] + list(extra)),
            "iat": now,
            "exp": now + ttl_s,
        }
        # Tokens this verifier issues must pass its own checks, configured iss/aud included.
        if self._issuer is not None:
            claims["iss"] = self._issuer
        if self._audience is not None:
            claims["aud"] = self._audience
        _name_claim(claims, "sub")
        _name_claim(claims, "tenant")
        return jwt.encode(claims, self._secret, algorithm=ALGORITHM)


class _CheckedOnce(HMACAlgorithm):
    """HS256 with one key, checked when it is made. PyJWT checks an HMAC key on every decode
    (that it is no PEM, SSH or DER key, nor a JWK's JSON): a fifth of a token's check."""

    def __init__(self, key: bytes) -> None:
        super().__init__(HMACAlgorithm.SHA256)
        self.key = super().prepare_key(key)

    def prepare_key(self, key: str | bytes) -> bytes:
        return self.key if key is self.key else super().prepare_key(key)


class _SecretKey(PyJWK):
    """The secret as PyJWT's key object, whose algorithm checks it once (`_CheckedOnce`).
    A PyJWK also holds PyJWT to that algorithm, whatever the token's header says."""

    def __init__(self, secret: str) -> None:
        encoded = base64url_encode(secret.encode()).decode()
        super().__init__({"kty": "oct", "k": encoded, "alg": ALGORITHM})
        checked = _CheckedOnce(self.key)
        self.Algorithm = checked
        self.key = checked.key


def secret_key(secret: str) -> PyJWK:
    """The HS256 secret as the key tokens are checked with. ValueError when it is shaped like a
    public key (PEM, SSH or DER) or a JWK: such a secret is how algorithm confusion works."""
    try:
        return _SecretKey(secret)
    except jwt.InvalidKeyError:
        raise ValueError(
            "the token secret looks like an asymmetric key (PEM, SSH or DER) or a JWK: HS256 "
            "needs a random secret (an identity provider's public keys go in a JWKS)"
        ) from None


def _check_size(token: str) -> None:
    if not isinstance(token, str) or not token:
        raise AuthError("token is missing")
    if len(token) > MAX_TOKEN_CHARS:
        raise AuthError("token is too long")


def _kept(claims: Mapping[str, Any], paths: tuple[str, ...]) -> dict[str, Any]:
    kept = {}
    for path in paths:
        value = claim_at(claims, path)
        if value is not MISSING:
            kept[path] = value
    return kept


def _issued_at(token: str) -> float | None:
    """The token's `iat`, unverified (see `RemoteKeys.retry_after`); None when it has none."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    value = claims.get("iat")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _kid(header: dict[str, Any]) -> str:
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid:
        raise AuthError("token has no key id ('kid')")
    return kid


def _name_claim(claims: dict[str, Any], name: str) -> str:
    """The string at claim path `name`."""
    value = claim_at(claims, name)
    if value is MISSING:
        raise AuthError(f"token is missing the {name!r} claim")
    if not isinstance(value, str) or not value:
        raise AuthError(f"token claim {name!r} must be a non-empty string")
    if len(value) > MAX_CLAIM_CHARS:
        raise AuthError(f"token claim {name!r} is longer than {MAX_CLAIM_CHARS} characters")
    return value


def _time_claim(claims: dict[str, Any], name: str) -> None:
    if name not in claims:
        return
    value = claims[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise AuthError(f"token claim {name!r} must be a number (seconds since the epoch)")


def _roles_claim(
    value: object, custom_roles: frozenset[str] = frozenset(), *, lenient: bool = False
) -> tuple[frozenset[Role], frozenset[str]]:
    """`lenient`: names that are neither a gateway role nor a custom one are skipped."""
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
            if lenient:
                continue
            # Refused rather than dropped: a typo in an issuer's role would otherwise silently
            # demote a reviewer. Clipped because the value comes from the caller.
            raise AuthError(f"token has an unknown role {item[:32]!r}") from None
    return frozenset(roles), frozenset(extra)


# --- access rules (docs/protocol.md §3) -----------------------------------------------------------


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


class DecidedBy(StrEnum):
    """Who decides the calls of a tool (`AgentGraph.decided_by`, docs/protocol.md §3)."""

    # The run's own user: the owning user of the thread (the "send this email?" confirmation).
    USER = "user"
    # Reviewers and admins of the tenant.
    REVIEWER = "reviewer"
    # Both.
    EITHER = "either"


def default_decided_by(self_approval: bool) -> DecidedBy:
    """Who decides the calls of a tool its graph says nothing about: GATEWAY_SELF_APPROVAL."""
    return DecidedBy.EITHER if self_approval else DecidedBy.REVIEWER


def check_can_decide(
    principal: Principal,
    thread: ThreadRef,
    *,
    self_approval: bool,
    decided_by: DecidedBy | None = None,
) -> DecidedBy:
    """Decide an approval on a thread: a reviewer or admin of the tenant, or the owning user.

    `decided_by` is who decides the call's tool; None takes the global default, where the owning
    user may decide their own run's approvals only when `self_approval` (GATEWAY_SELF_APPROVAL)
    is on. Returns the capacity the principal decides in (`USER` or `REVIEWER`): a reviewer who
    also owns the thread decides as a reviewer, unless only the user decides the tool.
    Another tenant's thread is `not_found`; everyone else in the tenant gets `forbidden`.
    """
    _require_same_tenant(principal, thread)
    mode = decided_by or default_decided_by(self_approval)
    owning = _is_owning_user(principal, thread)
    if mode is DecidedBy.USER:
        if owning:
            return DecidedBy.USER
        raise AccessDenied("forbidden", "the run's own user decides this call, not a reviewer")
    if principal.has_any(Role.REVIEWER, Role.ADMIN):
        return DecidedBy.REVIEWER
    if owning and mode is DecidedBy.EITHER:
        return DecidedBy.USER
    if owning:
        raise AccessDenied("forbidden", "self-approval is disabled: a reviewer must decide")
    raise AccessDenied("forbidden", "deciding approvals needs the reviewer or admin role")


def check_can_use_inbox(principal: Principal) -> None:
    """The tenant-wide approval inbox: reviewers and admins."""
    if not principal.has_any(Role.REVIEWER, Role.ADMIN):
        raise AccessDenied("forbidden", "the approval inbox needs the reviewer or admin role")
