"""Tokens shaped as identity providers issue them, verified over a JWKS: the user, tenant and
roles read from configured claim paths, provider role names mapped onto the gateway's roles,
roles of other applications ignored, a fixed tenant for a single-tenant deployment, and what
the mapped roles then allow."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.app import build_verifier
from gateway.settings import SettingsError
from tests.support.client import Client, ProtocolFailure
from tests.support.gateway import test_settings as settings_for
from tests.support.jwks import KeyPair, jwks, rsa_key, write_jwks

NOW_TTL_S = 600


def keycloak_token(key: KeyPair, username: str, *realm_roles: str) -> str:
    now = int(time.time())
    return key.sign(
        {
            "exp": now + NOW_TTL_S,
            "iat": now,
            "iss": "https://sso.example.com/realms/acme",
            "sub": "8f14e45f-ceea-467f-a0e6-6a4b2b5e0d2f",
            "typ": "Bearer",
            "azp": "chat-frontend",
            "preferred_username": username,
            "realm_access": {"roles": ["offline_access", "uma_authorization", *realm_roles]},
            "resource_access": {"account": {"roles": ["manage-account", "view-profile"]}},
            "scope": "openid profile email",
        }
    )


def auth0_token(key: KeyPair, user_id: str, tenant: str, *roles: str) -> str:
    now = int(time.time())
    return key.sign(
        {
            "iss": "https://acme.eu.auth0.com/",
            "sub": user_id,
            "aud": ["https://gateway.example.com", "https://acme.eu.auth0.com/userinfo"],
            "iat": now,
            "exp": now + NOW_TTL_S,
            "scope": "openid profile",
            "permissions": ["read:threads"],
            "https://gateway.example.com/tenant": tenant,
            "https://gateway.example.com/roles": list(roles),
        }
    )


def entra_token(key: KeyPair, object_id: str, tenant_id: str, *app_roles: str) -> str:
    now = int(time.time())
    return key.sign(
        {
            "aud": "api://gateway",
            "iss": f"https://login.microsoftonline.com/{tenant_id}/v2.0",
            "iat": now,
            "nbf": now,
            "exp": now + NOW_TTL_S,
            "oid": object_id,
            "tid": tenant_id,
            "sub": "AAAAAAAAAAAAAAAAAAAAAIkzqFVrSaSaFHy782bbtaQ",
            "roles": list(app_roles),
            "scp": "access_as_user",
            "ver": "2.0",
        }
    )


@pytest.fixture
def key() -> KeyPair:
    return rsa_key("idp-1")


@pytest.fixture
def jwks_path(tmp_path: Path, key: KeyPair) -> str:
    return str(write_jwks(tmp_path / "jwks.json", jwks(key)))


async def welcome_of(ws_url: str, token: str) -> dict[str, Any]:
    client = await Client.connect(ws_url, token)
    try:
        return {k: client.welcome[k] for k in ("user", "tenant", "roles")}
    finally:
        await client.close()


async def test_keycloak_realm_roles_with_a_fixed_tenant(
    gateway_factory: Callable[..., Any], key: KeyPair, jwks_path: str
) -> None:
    settings = {
        "jwks_file": jwks_path,
        "jwt_user_claim": "preferred_username",
        "jwt_roles_claim": "realm_access.roles",
        "jwt_tenant": "acme",
        "jwt_role_map": "chat-user=user, chat-reviewer=reviewer,chat-admin=admin",
    }
    async with gateway_factory(**settings) as gw:
        assert await welcome_of(gw.ws_url, keycloak_token(key, "rita", "chat-reviewer")) == {
            "user": "rita",
            "tenant": "acme",
            "roles": ["reviewer"],
        }
        # Roles the map does not name (offline_access, the account client's) are ignored.
        assert (await welcome_of(gw.ws_url, keycloak_token(key, "ulf")))["roles"] == []

        # What the mapped roles allow: a user acts, a reviewer sees the inbox, not vice versa.
        user = await Client.connect(gw.ws_url, keycloak_token(key, "ulf", "chat-user"))
        reviewer = await Client.connect(gw.ws_url, keycloak_token(key, "rita", "chat-reviewer"))
        try:
            assert (await user.request("thread.create"))["thread_id"]
            with pytest.raises(ProtocolFailure) as refused:
                await user.request("inbox.subscribe")
            assert refused.value.frame["code"] == "forbidden"
            await reviewer.request("inbox.subscribe")
        finally:
            await user.close()
            await reviewer.close()
        # The gateway's own development tokens keep their layout beside the provider's.
        assert (await welcome_of(gw.ws_url, gw.token("alice", "user")))["user"] == "alice"


async def test_auth0_namespaced_claims(
    gateway_factory: Callable[..., Any], key: KeyPair, jwks_path: str
) -> None:
    settings = {
        "jwks_file": jwks_path,
        "jwt_audience": "https://gateway.example.com",
        "jwt_tenant_claim": "https://gateway.example.com/tenant",
        "jwt_roles_claim": "https://gateway.example.com/roles",
        "jwt_role_map": "Support Agent=user,Approver=reviewer",
    }
    async with gateway_factory(**settings) as gw:
        token = auth0_token(key, "auth0|65f1c0", "globex", "Approver", "Support Agent", "Billing")
        assert await welcome_of(gw.ws_url, token) == {
            "user": "auth0|65f1c0",
            "tenant": "globex",
            "roles": ["reviewer", "user"],
        }
        # No tenant in the token: refused, naming the claim it looked for.
        now = int(time.time())
        untenanted = key.sign(
            {"sub": "auth0|1", "aud": "https://gateway.example.com", "exp": now + 60}
        )
        with pytest.raises(ProtocolFailure) as refused:
            await Client.connect(gw.ws_url, untenanted)
        assert refused.value.frame["code"] == "unauthorized"
        assert "https://gateway.example.com/tenant" in refused.value.frame["message"]


async def test_entra_app_roles_and_tenant_id(
    gateway_factory: Callable[..., Any], key: KeyPair, jwks_path: str
) -> None:
    tenant_id = "72f988bf-86f1-41af-91ab-2d7cd011db47"
    settings = {
        "jwks_file": jwks_path,
        "jwt_audience": "api://gateway",
        "jwt_user_claim": "oid",
        "jwt_tenant_claim": "tid",
        "jwt_role_map": "Gateway.User=user,Gateway.Reviewer=reviewer,Gateway.Admin=admin",
    }
    async with gateway_factory(**settings) as gw:
        token = entra_token(key, "00000000-0000-0000-0000-00000000b0b0", tenant_id, "Gateway.Admin")
        assert await welcome_of(gw.ws_url, token) == {
            "user": "00000000-0000-0000-0000-00000000b0b0",
            "tenant": tenant_id,
            "roles": ["admin"],
        }


def test_a_role_map_naming_a_role_the_gateway_does_not_know_is_refused(
    jwks_path: str, tmp_path: Path
) -> None:
    settings = settings_for(tmp_path / "g.db", jwks_file=jwks_path, jwt_role_map="boss=overlord")
    with pytest.raises(ValueError, match="does not know: overlord"):
        build_verifier(settings)
    # A custom role an agent graph requires for its tools is a valid target.
    build_verifier(settings.model_copy(update={"jwt_role_map": "money=finance"}), ["finance"])
    with pytest.raises(SettingsError, match="GATEWAY_JWT_ROLE_MAP"):
        settings_for(tmp_path / "g.db", jwt_role_map="reviewer")
