"""JWT verification and the access table of docs/protocol.md §3."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable
from typing import Any

import jwt
import orjson
import pytest

from gateway.auth.access import (
    AccessDenied,
    AuthError,
    Principal,
    Role,
    ThreadRef,
    TokenVerifier,
    check_can_act_on_thread,
    check_can_create,
    check_can_decide,
    check_can_subscribe,
    check_can_use_inbox,
)
from tests.support.jwks import claims

SECRET = "unit-test-secret-long-enough-for-every-hmac-variant-0123456789abcdef"


@pytest.fixture
def verifier() -> TokenVerifier:
    return TokenVerifier(SECRET)


def sign(payload: dict[str, Any], *, key: str = SECRET, alg: str = "HS256") -> str:
    return jwt.encode(payload, key, algorithm=alg)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hand_made(header: dict[str, Any], payload: dict[str, Any], signature: bytes) -> str:
    return f"{b64(orjson.dumps(header))}.{b64(orjson.dumps(payload))}.{b64(signature)}"


def assert_refused(verifier: TokenVerifier, token: str, fragment: str = "") -> AuthError:
    with pytest.raises(AuthError) as info:
        verifier.verify(token)
    message = str(info.value)
    assert fragment in message
    assert SECRET not in message
    if token:
        assert token not in message
    return info.value


# --- tokens --------------------------------------------------------------------------------


def test_issue_then_verify_round_trip(verifier: TokenVerifier) -> None:
    token = verifier.issue("u1", "acme", [Role.USER, "reviewer"])
    assert verifier.verify(token) == Principal(
        user="u1", tenant="acme", roles=frozenset({Role.USER, Role.REVIEWER})
    )


def test_verify_token_signed_elsewhere(verifier: TokenVerifier) -> None:
    principal = verifier.verify(sign(claims(roles=["viewer", "admin"])))
    assert principal.user == "alice"
    assert principal.tenant == "acme"
    assert principal.roles == {Role.VIEWER, Role.ADMIN}
    assert principal.has(Role.ADMIN)
    assert not principal.has(Role.USER)


def test_missing_roles_claim_means_no_roles(verifier: TokenVerifier) -> None:
    assert verifier.verify(sign(claims(roles=...))).roles == frozenset()


def test_duplicate_roles_collapse(verifier: TokenVerifier) -> None:
    assert verifier.verify(sign(claims(roles=["user", "user"]))).roles == {Role.USER}


def test_expired_token(verifier: TokenVerifier) -> None:
    now = int(time.time())
    err = assert_refused(verifier, sign(claims(iat=now - 600, exp=now - 120)), "expired")
    assert err.code == "unauthorized"


def test_leeway_tolerates_small_clock_skew() -> None:
    now = int(time.time())
    token = sign(claims(iat=now - 600, exp=now - 10))
    assert TokenVerifier(SECRET, leeway_s=30).verify(token).user == "alice"
    assert_refused(TokenVerifier(SECRET, leeway_s=0), token, "expired")


def test_not_yet_valid_token(verifier: TokenVerifier) -> None:
    assert_refused(verifier, sign(claims(nbf=int(time.time()) + 3600)), "not valid yet")


def test_bad_signature(verifier: TokenVerifier) -> None:
    token = sign(claims(), key="another-secret-that-is-also-long-enough-xx")
    assert_refused(verifier, token, "signature")


def test_tampered_payload(verifier: TokenVerifier) -> None:
    header, _, signature = sign(claims()).split(".")
    forged = b64(orjson.dumps(claims(roles=["admin"])))
    assert_refused(verifier, f"{header}.{forged}.{signature}", "signature")


def test_alg_none_is_refused(verifier: TokenVerifier) -> None:
    token = hand_made({"alg": "none", "typ": "JWT"}, claims(roles=["admin"]), b"")
    assert_refused(verifier, token)


@pytest.mark.parametrize("alg", ["RS256", "HS512", "ES256"])
def test_other_alg_header_with_hmac_signature_is_refused(verifier: TokenVerifier, alg: str) -> None:
    # Key confusion: an HMAC over the secret presented as another algorithm.
    header, payload = {"alg": alg, "typ": "JWT"}, claims()
    signing_input = f"{b64(orjson.dumps(header))}.{b64(orjson.dumps(payload))}".encode()
    signature = hmac.new(SECRET.encode(), signing_input, hashlib.sha256).digest()
    assert_refused(verifier, hand_made(header, payload, signature))


def test_hs384_with_the_right_key_is_refused(verifier: TokenVerifier) -> None:
    assert_refused(verifier, sign(claims(), alg="HS384"), "algorithm")


@pytest.mark.parametrize("claim", ["sub", "tenant", "exp"])
def test_missing_required_claim(verifier: TokenVerifier, claim: str) -> None:
    assert_refused(verifier, sign(claims(**{claim: ...})), claim)


@pytest.mark.parametrize(
    "overrides",
    [
        {"sub": ""},
        {"tenant": ""},
        {"tenant": 5},
        {"tenant": None},
        {"tenant": "t" * 257},
        {"sub": "u" * 257},
        {"exp": "tomorrow"},
        # 1 to int(): long expired, so refused before its type is looked at.
        {"exp": True},
    ],
)
def test_malformed_claims(verifier: TokenVerifier, overrides: dict[str, Any]) -> None:
    assert_refused(verifier, sign(claims(**overrides)))


def _in(seconds: int) -> int:
    return int(time.time()) + seconds


@pytest.mark.parametrize(
    ("overrides", "claim"),
    [
        # PyJWT reads these with int(): digits in a string and booleans would pass.
        ({"exp": str(_in(3600))}, "exp"),
        ({"nbf": str(_in(-60))}, "nbf"),
        ({"nbf": False}, "nbf"),
        ({"iat": str(_in(-60))}, "iat"),
        ({"iat": True}, "iat"),
    ],
)
def test_time_claims_must_be_numbers(
    verifier: TokenVerifier, overrides: dict[str, Any], claim: str
) -> None:
    assert_refused(verifier, sign(claims(**overrides)), f"{claim!r} must be a number")


def test_numeric_time_claims_are_accepted(verifier: TokenVerifier) -> None:
    token = sign(claims(exp=_in(3600) + 0.5, nbf=_in(-60), iat=float(_in(-60))))
    assert verifier.verify(token).user


@pytest.mark.parametrize(
    ("roles", "fragment"),
    [
        (["user", "superuser"], "unknown role 'superuser'"),
        (["Admin"], "unknown role"),
        ("admin", "must be a list"),
        ({"admin": True}, "must be a list"),
        ([1], "must hold strings"),
        ([None], "must hold strings"),
    ],
)
def test_bad_roles_claim(verifier: TokenVerifier, roles: Any, fragment: str) -> None:
    assert_refused(verifier, sign(claims(roles=roles)), fragment)


@pytest.mark.parametrize("token", ["", "not-a-jwt", "a.b.c", "x" * 10_000])
def test_garbage_tokens(verifier: TokenVerifier, token: str) -> None:
    assert_refused(verifier, token)


def test_issue_rejects_unknown_role_and_bad_ttl(verifier: TokenVerifier) -> None:
    with pytest.raises(ValueError):
        verifier.issue("u1", "acme", ["superuser"])
    with pytest.raises(ValueError):
        verifier.issue("u1", "acme", ["user"], ttl_s=0)
    with pytest.raises(AuthError):
        verifier.issue("", "acme", ["user"])


def test_issued_token_uses_hs256_and_expires(verifier: TokenVerifier) -> None:
    token = verifier.issue("u1", "acme", ["user"], ttl_s=60)
    assert jwt.get_unverified_header(token)["alg"] == "HS256"
    payload = jwt.decode(token, SECRET, algorithms=["HS256"])
    assert 0 < payload["exp"] - time.time() <= 60


def test_empty_secret_is_refused() -> None:
    with pytest.raises(ValueError):
        TokenVerifier("")


# --- the access table ----------------------------------------------------------------------

THREAD = ThreadRef(tenant="acme", owner="owner")

# persona -> (user id, roles); "owner" is the thread's owner, everyone else is not.
PERSONAS: dict[str, tuple[str, frozenset[Role]]] = {
    "owner_user": ("owner", frozenset({Role.USER})),
    "other_user": ("someone", frozenset({Role.USER})),
    "reviewer": ("rev", frozenset({Role.REVIEWER})),
    "viewer": ("view", frozenset({Role.VIEWER})),
    "admin": ("boss", frozenset({Role.ADMIN})),
    # Combinations and edge cases.
    "owner_user_reviewer": ("owner", frozenset({Role.USER, Role.REVIEWER})),
    "owner_viewer_only": ("owner", frozenset({Role.VIEWER})),
    "owner_admin": ("owner", frozenset({Role.ADMIN})),
    "other_user_viewer": ("someone", frozenset({Role.USER, Role.VIEWER})),
    "no_roles": ("owner", frozenset()),
}

OK = None
F = "forbidden"

# docs/protocol.md §3, same tenant: persona -> (act, subscribe, decide, decide with self-approval)
SAME_TENANT: dict[str, tuple[str | None, str | None, str | None, str | None]] = {
    "owner_user": (OK, OK, F, OK),
    "other_user": (F, F, F, F),
    "reviewer": (F, OK, OK, OK),
    "viewer": (F, OK, F, F),
    "admin": (OK, OK, OK, OK),
    "owner_user_reviewer": (OK, OK, OK, OK),
    "owner_viewer_only": (F, OK, F, F),
    "owner_admin": (OK, OK, OK, OK),
    "other_user_viewer": (F, OK, F, F),
    "no_roles": (F, F, F, F),
}

ThreadCheck = Callable[[Principal, ThreadRef], None]
ACTIONS: dict[str, ThreadCheck] = {
    "act": check_can_act_on_thread,
    "subscribe": check_can_subscribe,
    "decide": lambda pr, th: check_can_decide(pr, th, self_approval=False),
    "decide_self": lambda pr, th: check_can_decide(pr, th, self_approval=True),
}


def principal(persona: str, tenant: str) -> Principal:
    user, roles = PERSONAS[persona]
    return Principal(user=user, tenant=tenant, roles=roles)


def outcome(check: Callable[[], None]) -> str | None:
    try:
        check()
    except AccessDenied as exc:
        assert exc.message
        return exc.code
    return None


def test_table_covers_every_persona() -> None:
    assert set(SAME_TENANT) == set(PERSONAS)


@pytest.mark.parametrize("action", list(ACTIONS))
@pytest.mark.parametrize("persona", list(PERSONAS))
def test_same_tenant_access(persona: str, action: str) -> None:
    expected = SAME_TENANT[persona][list(ACTIONS).index(action)]
    assert outcome(lambda: ACTIONS[action](principal(persona, "acme"), THREAD)) == expected


@pytest.mark.parametrize("action", list(ACTIONS))
@pytest.mark.parametrize("persona", list(PERSONAS))
def test_other_tenant_is_always_not_found(persona: str, action: str) -> None:
    # Same user id as the owner in another tenant, admins included: existence is never revealed.
    assert outcome(lambda: ACTIONS[action](principal(persona, "globex"), THREAD)) == "not_found"


@pytest.mark.parametrize(
    ("persona", "create", "inbox"),
    [
        ("owner_user", OK, F),
        ("reviewer", F, OK),
        ("viewer", F, F),
        ("admin", OK, OK),
        ("owner_user_reviewer", OK, OK),
        ("other_user_viewer", OK, F),
        ("no_roles", F, F),
    ],
)
def test_thread_free_actions(persona: str, create: str | None, inbox: str | None) -> None:
    pr = principal(persona, "acme")
    assert outcome(lambda: check_can_create(pr)) == create
    assert outcome(lambda: check_can_use_inbox(pr)) == inbox


def test_self_approval_refusal_says_why() -> None:
    with pytest.raises(AccessDenied) as info:
        check_can_decide(principal("owner_user", "acme"), THREAD, self_approval=False)
    assert info.value.code == "forbidden"
    assert "self-approval" in info.value.message
