"""Token verification beyond the basics of test_auth.py: leeway at both edges, issuer and
audience, algorithm pinning and confusion, RS256/ES256 through a JWKS file and a JWKS URL
(served by a real local HTTP server), and the settings that configure them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from pathlib import Path
from typing import Any

import jwt
import pytest

from gateway.auth.access import AuthError, AuthUnavailable, Principal, Role, TokenVerifier
from gateway.auth.jwks import JwksError, RemoteKeys, StaticKeys, load_jwks_file, parse_jwks
from gateway.settings import SettingsError, load_settings
from tests.support.jwks import (
    KeyPair,
    claims,
    closed_port_url,
    ec_key,
    jwks,
    rsa_key,
    serve_jwks,
    write_jwks,
)

SECRET = "unit-test-secret-long-enough-for-every-hmac-variant-0123456789abcdef"


@pytest.fixture(scope="module")
def rsa() -> KeyPair:
    return rsa_key("rsa-1")


@pytest.fixture(scope="module")
def ec() -> KeyPair:
    return ec_key("ec-1")


def hs256(payload: dict[str, Any], *, key: str = SECRET, alg: str = "HS256") -> str:
    return jwt.encode(payload, key, algorithm=alg)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hmac_token(header: dict[str, Any], payload: dict[str, Any], key: bytes) -> str:
    """Signed by hand, so any key (a public key's PEM included) can serve as HMAC secret."""
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(payload).encode())}"
    signature = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"


def refused(verifier: TokenVerifier, token: str, fragment: str = "") -> AuthError:
    with pytest.raises(AuthError) as info:
        verifier.verify(token)
    assert fragment in info.value.message, info.value.message
    assert info.value.code == "unauthorized"
    assert token not in info.value.message and SECRET not in info.value.message
    return info.value


def static(*keys: KeyPair) -> StaticKeys:
    return StaticKeys(parse_jwks(jwks(*keys), strict=True))


# --- HS256 with the secret -------------------------------------------------------------------


def test_hs512_with_the_right_secret_is_refused() -> None:
    refused(TokenVerifier(SECRET), hs256(claims(), alg="HS512"), "algorithm")


def test_rs256_where_hs256_is_expected_is_refused(rsa: KeyPair) -> None:
    refused(TokenVerifier(SECRET), rsa.sign(claims()), "algorithm")


def test_alg_none_is_refused(rsa: KeyPair) -> None:
    token = jwt.encode(claims(roles=["admin"]), "", algorithm="none")
    refused(TokenVerifier(SECRET), token)
    refused(TokenVerifier(None, keys=static(rsa)), token)
    with_kid = jwt.encode(claims(), "", algorithm="none", headers={"kid": rsa.kid})
    refused(TokenVerifier(None, keys=static(rsa)), with_kid, "algorithm")
    refused(TokenVerifier(SECRET, keys=static(rsa)), with_kid, "algorithm")


def test_expired_and_not_yet_valid() -> None:
    verifier = TokenVerifier(SECRET, leeway_s=0)
    now = int(time.time())
    refused(verifier, hs256(claims(iat=now - 100, exp=now - 5)), "expired")
    refused(verifier, hs256(claims(nbf=now + 60)), "not valid yet")


@pytest.mark.parametrize(
    ("claim", "offset", "accepted"),
    [
        # exp a little in the past: inside the leeway it still counts, beyond it not.
        ("exp", -3, True),
        ("exp", -9, False),
        # nbf a little in the future: the same, on the other edge.
        ("nbf", 3, True),
        ("nbf", 9, False),
    ],
)
def test_leeway_is_honoured_at_both_edges(claim: str, offset: int, accepted: bool) -> None:
    verifier = TokenVerifier(SECRET, leeway_s=6)
    token = hs256(claims(**{claim: int(time.time()) + offset}))
    if accepted:
        assert verifier.verify(token).user == "alice"
    else:
        refused(verifier, token, "expired" if claim == "exp" else "not valid yet")


def test_zero_leeway_is_exact() -> None:
    token = hs256(claims(exp=int(time.time()) - 2))
    refused(TokenVerifier(SECRET, leeway_s=0), token, "expired")
    assert TokenVerifier(SECRET, leeway_s=10).verify(token).user == "alice"


def test_principal_carries_the_expiry() -> None:
    exp = int(time.time()) + 120
    principal = TokenVerifier(SECRET).verify(hs256(claims(exp=exp)))
    assert principal.expires_at == exp
    # Expiry is not identity: the same user with another token is the same principal.
    assert principal == Principal(user="alice", tenant="acme", roles=frozenset({Role.USER}))


def test_tampered_payload_is_refused(rsa: KeyPair) -> None:
    for verifier, token in [
        (TokenVerifier(SECRET), hs256(claims())),
        (TokenVerifier(None, keys=static(rsa)), rsa.sign(claims())),
    ]:
        header, _, signature = token.split(".")
        forged = b64(json.dumps(claims(roles=["admin"])).encode())
        refused(verifier, f"{header}.{forged}.{signature}", "signature")


# --- issuer and audience ---------------------------------------------------------------------


def test_issuer_must_match_when_configured() -> None:
    verifier = TokenVerifier(SECRET, issuer="https://idp.example")
    assert verifier.verify(hs256(claims(iss="https://idp.example"))).user == "alice"
    refused(verifier, hs256(claims(iss="https://evil.example")), "issuer")
    refused(verifier, hs256(claims()), "'iss'")


def test_audience_must_match_when_configured() -> None:
    verifier = TokenVerifier(SECRET, audience="agents-gateway")
    assert verifier.verify(hs256(claims(aud="agents-gateway"))).user == "alice"
    assert verifier.verify(hs256(claims(aud=["other", "agents-gateway"]))).user == "alice"
    refused(verifier, hs256(claims(aud="another-service")), "audience")
    refused(verifier, hs256(claims()), "'aud'")


def test_a_token_for_some_audience_is_refused_when_none_is_configured() -> None:
    # A token meant for a named service is not meant for a gateway that names none.
    refused(TokenVerifier(SECRET), hs256(claims(aud="another-service")), "audience")


def test_issued_tokens_carry_the_configured_issuer_and_audience() -> None:
    verifier = TokenVerifier(SECRET, issuer="https://idp.example", audience="gw")
    token = verifier.issue("alice", "acme", ["user"])
    payload = jwt.decode(token, SECRET, algorithms=["HS256"], audience="gw")
    assert payload["iss"] == "https://idp.example"
    assert payload["aud"] == "gw"
    assert verifier.verify(token).user == "alice"
    # A verifier configured for another audience does not take it.
    refused(TokenVerifier(SECRET, audience="other"), token, "audience")


# --- a JWKS file -----------------------------------------------------------------------------


def test_rs256_and_es256_through_a_jwks_file(tmp_path: Path, rsa: KeyPair, ec: KeyPair) -> None:
    path = write_jwks(tmp_path / "jwks.json", jwks(rsa, ec))
    verifier = TokenVerifier(None, keys=StaticKeys.from_file(path))
    assert verifier.verify(rsa.sign(claims(sub="rita"))).user == "rita"
    assert verifier.verify(ec.sign(claims(sub="eve", roles=["reviewer"]))).roles == {Role.REVIEWER}
    # HS256 is never accepted without a secret, even with a valid-looking HMAC.
    refused(verifier, hs256(claims()), "kid")


def test_the_secret_and_a_jwks_work_side_by_side(rsa: KeyPair) -> None:
    verifier = TokenVerifier(SECRET, keys=static(rsa))
    assert verifier.verify(hs256(claims(sub="dev"))).user == "dev"
    assert verifier.verify(rsa.sign(claims(sub="idp"))).user == "idp"


@pytest.mark.parametrize("with_secret", [False, True])
def test_algorithm_confusion_with_the_rsa_public_key_as_hmac_secret(
    rsa: KeyPair, with_secret: bool
) -> None:
    verifier = TokenVerifier(SECRET if with_secret else None, keys=static(rsa))
    header = {"alg": "HS256", "typ": "JWT", "kid": rsa.kid}
    for key in (rsa.public_pem(), json.dumps(rsa.jwk()).encode()):
        token = hmac_token(header, claims(roles=["admin"]), key)
        # With a secret the HMAC is checked against it; without one the RSA key only
        # verifies RS256. Either way the forgery fails.
        refused(verifier, token, "signature" if with_secret else "algorithm")


def test_each_key_verifies_only_its_own_algorithm(rsa: KeyPair, ec: KeyPair) -> None:
    verifier = TokenVerifier(None, keys=static(rsa, ec))
    # Headers that name the other key: the key's algorithm wins, never the header's.
    refused(verifier, ec.sign(claims(), kid=rsa.kid), "algorithm")
    refused(verifier, rsa.sign(claims(), kid=ec.kid), "algorithm")
    refused(verifier, rsa.sign(claims(), algorithm="RS512"), "algorithm")
    refused(verifier, rsa.sign(claims(), algorithm="PS256"), "algorithm")


def test_unknown_and_missing_kid(rsa: KeyPair) -> None:
    verifier = TokenVerifier(None, keys=static(rsa))
    refused(verifier, rsa_key("rsa-2").sign(claims()), "not known")
    refused(verifier, rsa.sign(claims(), kid=None), "kid")


def test_a_key_not_in_the_file_is_refused_even_with_a_known_kid(rsa: KeyPair) -> None:
    impostor = rsa_key(rsa.kid)
    refused(TokenVerifier(None, keys=static(rsa)), impostor.sign(claims()), "signature")


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        ({"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "h"}]}, "symmetric"),
        ({"keys": []}, "no usable signing key"),
        ({"nokeys": True}, '"keys" list'),
        ([1, 2], '"keys" list'),
        ({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "AA", "kid": "o"}]}, "not supported"),
        ({"keys": ["not an object"]}, "not a JSON object"),
        ({"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB"}]}, "'kid'"),
        ({"keys": [{"kty": "RSA", "n": "!!", "e": "AQAB", "kid": "r"}]}, "malformed"),
    ],
)
def test_bad_jwks_documents(document: object, fragment: str) -> None:
    with pytest.raises(JwksError) as info:
        parse_jwks(document, strict=True)
    assert fragment in str(info.value)


def test_key_level_mistakes_in_a_file(tmp_path: Path, rsa: KeyPair, ec: KeyPair) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"keys": [rsa.jwk(alg="RS512")]}, "only be used with RS256"),
        ({"keys": [ec.jwk(alg="ES384")]}, "only be used with ES256"),
        ({"keys": [rsa.jwk(), rsa.jwk()]}, "more than once"),
        ({"keys": [{**rsa.jwk(), "d": "AQAB"}]}, "private key"),
        ({"keys": [rsa_key("short", bits=1024).jwk()]}, "shorter than 2048"),
        ({"keys": [{**ec.jwk(), "crv": "P-384"}]}, "P-256"),
    ]
    for document, fragment in cases:
        with pytest.raises(JwksError) as info:
            load_jwks_file(write_jwks(tmp_path / "jwks.json", document))
        assert fragment in str(info.value), (fragment, str(info.value))


def test_keys_for_other_uses_are_skipped(rsa: KeyPair, ec: KeyPair) -> None:
    keys = parse_jwks({"keys": [rsa.jwk(use="enc"), ec.jwk()]}, strict=True)
    assert list(keys) == [ec.kid]


def test_a_provider_document_skips_keys_it_cannot_use(rsa: KeyPair) -> None:
    document = {"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "h"}, rsa.jwk()]}
    assert list(parse_jwks(document, strict=False)) == [rsa.kid]
    with pytest.raises(JwksError):
        parse_jwks(document, strict=True)


# --- a JWKS URL ------------------------------------------------------------------------------


async def test_rs256_and_es256_through_a_jwks_url(rsa: KeyPair, ec: KeyPair) -> None:
    with serve_jwks(jwks(rsa, ec)) as server:
        keys = RemoteKeys(server.url, cache_s=300, refetch_s=30)
        verifier = TokenVerifier(None, keys=keys)
        try:
            # The synchronous path never fetches: nothing is cached yet.
            refused(verifier, rsa.sign(claims()), "not known")
            assert (await verifier.authenticate(rsa.sign(claims(sub="rita")))).user == "rita"
            assert (await verifier.authenticate(ec.sign(claims(sub="eve")))).user == "eve"
            assert verifier.verify(ec.sign(claims(sub="eve"))).user == "eve"
            assert server.requests == 1  # one fetch, then the cache
        finally:
            await verifier.aclose()


async def test_unknown_kid_refetches_at_most_once_per_interval(rsa: KeyPair) -> None:
    rotated = rsa_key("rsa-rotated")
    with serve_jwks(jwks(rsa)) as server:
        now = [1000.0]
        keys = RemoteKeys(server.url, cache_s=300, refetch_s=30, clock=lambda: now[0])
        verifier = TokenVerifier(None, keys=keys)
        try:
            assert (await verifier.authenticate(rsa.sign(claims()))).user == "alice"
            # The provider rotates; a token with the new kid arrives within the interval. It
            # may be signed with a key published since the last fetch: retryable, saying when,
            # and the provider is not asked again before the interval is over.
            server.document = jwks(rsa, rotated)
            now[0] += 5
            for _ in range(5):
                with pytest.raises(AuthUnavailable) as info:
                    await verifier.authenticate(rotated.sign(claims(iat=int(time.time()) + 1)))
                assert info.value.code == "unavailable"
                assert "fetched again within 25 s" in info.value.message
            assert server.requests == 1
            # A kid unknown to a fetch made after the token was issued: unknown for good.
            with pytest.raises(AuthError) as info:
                await verifier.authenticate(rotated.sign(claims(iat=int(time.time()) - 60)))
            assert info.value.code == "unauthorized" and "not known" in info.value.message
            # Once the interval has passed, one refetch finds the new key.
            now[0] += 30
            assert (await verifier.authenticate(rotated.sign(claims(sub="new")))).user == "new"
            assert server.requests == 2
            with pytest.raises(AuthError) as info:
                await verifier.authenticate(
                    rsa_key("rsa-bogus").sign(claims(iat=int(time.time()) - 60))
                )
            assert info.value.code == "unauthorized"
            assert server.requests == 2
        finally:
            await verifier.aclose()


async def test_stale_keys_are_refetched_and_survive_an_outage(rsa: KeyPair) -> None:
    with serve_jwks(jwks(rsa)) as server:
        now = [1000.0]
        keys = RemoteKeys(server.url, cache_s=60, refetch_s=10, clock=lambda: now[0])
        verifier = TokenVerifier(None, keys=keys)
        try:
            await verifier.authenticate(rsa.sign(claims()))
            now[0] += 61
            server.status = 503
            # Stale and the provider is down: the cached key still answers.
            assert (await verifier.authenticate(rsa.sign(claims()))).user == "alice"
            assert server.requests == 2
            # A kid nobody can vouch for during the outage is retryable, not a refusal.
            with pytest.raises(AuthUnavailable) as info:
                await verifier.authenticate(rsa_key("rsa-new").sign(claims()))
            assert info.value.code == "unavailable"
            server.status = 200
            now[0] += 10
            assert (await verifier.authenticate(rsa.sign(claims()))).user == "alice"
            assert server.requests == 3
        finally:
            await verifier.aclose()


async def test_jwks_url_down_with_no_cache_is_unavailable(rsa: KeyPair) -> None:
    keys = RemoteKeys(closed_port_url(), cache_s=300, refetch_s=30)
    verifier = TokenVerifier(None, keys=keys)
    try:
        for _ in range(2):  # the second attempt is inside the refetch interval: no fetch
            with pytest.raises(AuthUnavailable) as info:
                await verifier.authenticate(rsa.sign(claims()))
            assert info.value.code == "unavailable"
            assert "try again" in info.value.message
    finally:
        await verifier.aclose()


async def test_a_bad_document_from_the_url_is_an_outage(rsa: KeyPair) -> None:
    with serve_jwks({"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "h"}]}) as server:
        verifier = TokenVerifier(None, keys=RemoteKeys(server.url, cache_s=300, refetch_s=0))
        try:
            with pytest.raises(AuthUnavailable):
                await verifier.authenticate(rsa.sign(claims()))
            # Fixed on the provider's side: the next fetch (no interval here) picks it up.
            server.document = jwks(rsa)
            assert (await verifier.authenticate(rsa.sign(claims()))).user == "alice"
        finally:
            await verifier.aclose()


async def test_hs256_tokens_never_trigger_a_fetch(rsa: KeyPair) -> None:
    with serve_jwks(jwks(rsa)) as server:
        verifier = TokenVerifier(SECRET, keys=RemoteKeys(server.url, cache_s=300, refetch_s=0))
        try:
            assert (await verifier.authenticate(hs256(claims()))).user == "alice"
            assert server.requests == 0
        finally:
            await verifier.aclose()


# --- settings --------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_gateway_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Settings come from the environment too: the caller's GATEWAY_* must not leak in.
    for name in list(os.environ):
        if name.startswith("GATEWAY_"):
            monkeypatch.delenv(name)


def settings(tmp_path: Path, **values: Any) -> Any:
    return load_settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}", **values)


def test_jwks_file_problems_stop_start_up_naming_the_variable(tmp_path: Path) -> None:
    bad = write_jwks(tmp_path / "bad.json", {"keys": [{"kty": "oct", "k": "AA", "kid": "h"}]})
    for path in (bad, tmp_path / "missing.json"):
        with pytest.raises(SettingsError) as info:
            settings(tmp_path, secret=SECRET, jwks_file=str(path))
        assert "GATEWAY_JWKS_FILE" in str(info.value)
    (tmp_path / "garbage.json").write_text("{not json")
    with pytest.raises(SettingsError, match=r"GATEWAY_JWKS_FILE.*not valid JSON"):
        settings(tmp_path, jwks_file=str(tmp_path / "garbage.json"))


def test_jwks_url_must_be_trustworthy(tmp_path: Path) -> None:
    for url in ("http://idp.example/jwks", "ftp://idp.example/jwks", "https://u:p@idp.example/"):
        with pytest.raises(SettingsError, match="GATEWAY_JWKS_URL"):
            settings(tmp_path, jwks_url=url)
    assert settings(tmp_path, jwks_url="https://idp.example/jwks").jwks_url
    assert settings(tmp_path, jwks_url="http://127.0.0.1:9/jwks").jwks_url


def test_one_jwks_source_at_a_time(tmp_path: Path, rsa: KeyPair) -> None:
    path = write_jwks(tmp_path / "jwks.json", jwks(rsa))
    with pytest.raises(SettingsError, match="GATEWAY_JWKS_FILE or GATEWAY_JWKS_URL"):
        settings(tmp_path, jwks_file=str(path), jwks_url="https://idp.example/jwks")


def test_dev_mode_needs_neither_secret_nor_jwks(tmp_path: Path, rsa: KeyPair) -> None:
    path = str(write_jwks(tmp_path / "jwks.json", jwks(rsa)))
    assert settings(tmp_path).dev_mode
    assert not settings(tmp_path, secret=SECRET).dev_mode
    # Only a JWKS: no development tokens, and listening publicly is allowed.
    jwks_only = settings(tmp_path, jwks_file=path, host="0.0.0.0")
    assert not jwks_only.dev_mode
    assert not settings(tmp_path, jwks_url="https://idp.example/jwks").dev_mode
    with pytest.raises(SettingsError, match="GATEWAY_SECRET"):
        settings(tmp_path, host="0.0.0.0")


def test_token_settings_defaults_and_bounds(tmp_path: Path) -> None:
    defaults = settings(tmp_path)
    assert defaults.jwt_leeway_s == 10
    assert defaults.jwt_issuer is None and defaults.jwt_audience is None
    with pytest.raises(SettingsError, match="GATEWAY_JWT_LEEWAY_S"):
        settings(tmp_path, jwt_leeway_s=-1)
    assert settings(tmp_path, jwt_issuer="", jwt_audience=" ").jwt_issuer is None


def test_a_verifier_needs_a_secret_or_keys_and_signs_only_with_a_secret(rsa: KeyPair) -> None:
    with pytest.raises(ValueError):
        TokenVerifier(None)
    with pytest.raises(ValueError, match="no secret"):
        TokenVerifier(None, keys=static(rsa)).issue("alice", "acme", ["user"])


def test_a_secret_shaped_like_a_public_key_stops_start_up(tmp_path: Path, rsa: KeyPair) -> None:
    # HS256 with a public key as its secret is how algorithm confusion works: refused once,
    # at start, rather than failing every token.
    for secret in (rsa.public_pem().decode(), json.dumps(rsa.jwk())):
        with pytest.raises(ValueError, match="asymmetric key"):
            TokenVerifier(secret)
        with pytest.raises(SettingsError, match=r"GATEWAY_SECRET.*asymmetric key"):
            settings(tmp_path, secret=secret)
    verifier = TokenVerifier(SECRET)
    assert verifier.verify(verifier.issue("alice", "acme", ["user"])).user == "alice"
