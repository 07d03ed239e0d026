"""Token failures are audited by reason category: each message the real verifier produces maps
to a stable category (the messages are for people and may be reworded)."""

from __future__ import annotations

import time
from typing import Any

import jwt
import pytest

from gateway.auth.access import AuthError, TokenVerifier
from gateway.auth.audit_trail import token_failure_reason

SECRET = "unit-secret-" + "y" * 52


def failure(token: str) -> str:
    with pytest.raises(AuthError) as caught:
        TokenVerifier(SECRET).verify(token)
    return caught.value.message


def signed(claims: dict[str, Any], key: str = SECRET) -> str:
    return jwt.encode(claims, key, algorithm="HS256")


NOW = int(time.time())
# The tokens are built when the module is collected, which can be many minutes before this
# test runs in a full suite: a valid one must stay valid far longer than that.
GOOD = {"sub": "alice", "tenant": "acme", "exp": NOW + 7 * 24 * 3600}


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (signed({**GOOD, "exp": NOW - 3600}), "expired"),
        (signed({**GOOD, "nbf": NOW + 3600}), "not_yet_valid"),
        (signed(GOOD, key="another-secret-" + "z" * 49), "bad_signature"),
        (signed({"sub": "alice", "tenant": "acme"}), "bad_claim"),
        (signed({**GOOD, "sub": ""}), "bad_claim"),
        (signed({**GOOD, "roles": ["wizard"]}), "unknown_role"),
        ("x" * 9000, "too_long"),
        ("not-a-jwt", "invalid"),
    ],
)
def test_verifier_messages_map_to_categories(token: str, reason: str) -> None:
    message = failure(token)
    assert token_failure_reason(message) == reason
    assert token not in message


def test_unknown_wording_is_invalid_and_missing_tokens_are_missing() -> None:
    assert token_failure_reason("something new went wrong") == "invalid"
    assert token_failure_reason("missing bearer token") == "missing"
