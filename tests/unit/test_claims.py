"""Claim paths and role mapping for identity-provider tokens (gateway/auth/claims.py)."""

from __future__ import annotations

import pytest

from gateway.auth.claims import MISSING, ClaimMapping, claim_at, parse_role_map

TOKEN = {
    "sub": "u1",
    "realm_access": {"roles": ["offline_access", "chat-reviewer"]},
    "https://example.com/roles": ["Approver"],
    "https://example.com": {"nested": "beside the namespaced key"},
    "roles": "user reviewer",
    "empty": None,
}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("sub", "u1"),
        ("realm_access.roles", ["offline_access", "chat-reviewer"]),
        # The longest key wins at each level: a namespaced claim with dots is one key...
        ("https://example.com/roles", ["Approver"]),
        # ...and a path through a key that holds dots still goes down a level.
        ("https://example.com.nested", "beside the namespaced key"),
        ("empty", None),
        ("realm_access.missing", MISSING),
        ("sub.deeper", MISSING),
        ("nowhere", MISSING),
    ],
)
def test_claim_at(path: str, value: object) -> None:
    assert (
        claim_at(TOKEN, path) == value if value is not MISSING else claim_at(TOKEN, path) is MISSING
    )


def test_role_map_parsing() -> None:
    assert parse_role_map(" a=user, Gateway.Reviewer = reviewer ,,") == {
        "a": "user",
        "Gateway.Reviewer": "reviewer",
    }
    assert parse_role_map("") == {}
    for bad in ("reviewer", "=user", "a="):
        with pytest.raises(ValueError, match="provider-role=gateway-role"):
            parse_role_map(bad)


def test_role_names_are_mapped_and_the_rest_ignored() -> None:
    mapped = ClaimMapping(roles="realm_access.roles", role_map={"chat-reviewer": "reviewer"})
    assert mapped.lenient_roles
    assert mapped.role_names(["offline_access", "chat-reviewer", 7]) == ["reviewer"]
    assert mapped.role_names("chat-reviewer other") == ["reviewer"]
    assert mapped.role_names(MISSING) == []
    assert mapped.role_names({"not": "a list"}) == []
    # Only a roles path of its own (no map): names are taken as they are, unknown ones later
    # skipped by the verifier.
    assert ClaimMapping(roles="groups").role_names(["reviewer", "x"]) == ["reviewer", "x"]
    # The gateway's own layout stays strict.
    assert not ClaimMapping().lenient_roles
