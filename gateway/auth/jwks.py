"""Public keys of an identity provider (a JWKS), from a file or fetched from a URL.

Each usable key is pinned to exactly one algorithm by its type: RSA keys verify RS256 only and
EC P-256 keys ES256 only. The token header never picks the algorithm, so a token cannot make a
public key act as an HMAC secret, and `none` never matches. Symmetric (`oct`) keys are refused:
HS256 is only ever verified with GATEWAY_SECRET.

A file is read once at start-up and must be entirely valid. A URL is fetched on demand without
blocking the event loop: keys are cached for `cache_s`, an unknown `kid` triggers a refetch, and
fetch attempts (successful or not) are spaced at least `refetch_s` apart, so a stream of tokens
with made-up key ids cannot turn the gateway into a load generator against the provider.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway.protocol.error_codes import CodedError, ErrorCode

log = logging.getLogger(__name__)

# A provider's JWKS is a few kilobytes; the caps keep a misconfigured or hostile endpoint (or
# file) from making the gateway read or hold something huge.
MAX_JWKS_BYTES = 1024 * 1024
MAX_KEYS = 100
MAX_KID_CHARS = 256
MIN_RSA_BITS = 2048
FETCH_TIMEOUT_S = 5.0


class JwksError(CodedError, ValueError):
    """A JWKS document (file or fetched) that cannot be used; the message names what is wrong."""


class KeysUnavailable(CodedError):
    """The key set could not be fetched and no cached key answers the question."""

    CODE = ErrorCode.UNAVAILABLE


@dataclass(frozen=True)
class SigningKey:
    kid: str
    # The only algorithm this key verifies.
    algorithm: str
    key: Any


def _pinned_algorithm(jwk: Mapping[str, Any]) -> str:
    kty = jwk.get("kty")
    if kty == "RSA":
        algorithm = "RS256"
    elif kty == "EC" and jwk.get("crv") == "P-256":
        algorithm = "ES256"
    elif kty == "EC":
        raise JwksError(f"EC curve {str(jwk.get('crv'))[:16]!r} is not supported (only P-256)")
    elif kty == "oct":
        raise JwksError("symmetric ('oct') keys are not accepted; HS256 uses GATEWAY_SECRET")
    else:
        raise JwksError(f"key type {str(kty)[:16]!r} is not supported (only RSA and EC P-256)")
    stated = jwk.get("alg")
    if stated is not None and stated != algorithm:
        raise JwksError(f"a {kty} key may only be used with {algorithm}, not {str(stated)[:16]!r}")
    return algorithm


def _signing_key(jwk: object) -> SigningKey | None:
    """One JWK as a SigningKey; None for a key meant for something else (`use` other than
    `sig`), which providers publish alongside their signing keys."""
    if not isinstance(jwk, dict):
        raise JwksError("is not a JSON object")
    use = jwk.get("use")
    if use is not None and use != "sig":
        return None
    kid = jwk.get("kid")
    if not isinstance(kid, str) or not kid or len(kid) > MAX_KID_CHARS:
        raise JwksError(f"needs a 'kid' string of 1 to {MAX_KID_CHARS} characters")
    if "d" in jwk:
        # A private key published as a verification key is a leak on the provider's side.
        raise JwksError(f"key {kid[:32]!r} contains private key material")
    algorithm = _pinned_algorithm(jwk)
    try:
        key = jwt.PyJWK(jwk, algorithm).key
    except jwt.PyJWTError:
        raise JwksError(f"key {kid[:32]!r} is malformed") from None
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < MIN_RSA_BITS:
        raise JwksError(f"key {kid[:32]!r} is shorter than {MIN_RSA_BITS} bits")
    return SigningKey(kid=kid, algorithm=algorithm, key=key)


def parse_jwks(document: object, *, strict: bool) -> dict[str, SigningKey]:
    """The usable signing keys of a JWKS document, by `kid`.

    `strict` (a file the operator wrote) refuses the whole document for any bad key; otherwise
    (a provider's endpoint) bad keys are skipped with a warning, since a provider may publish
    keys for algorithms this gateway does not accept. Either way, no usable key is an error.
    """
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise JwksError('must be a JSON object with a "keys" list')
    entries: list[object] = document["keys"]
    if len(entries) > MAX_KEYS:
        raise JwksError(f"has more than {MAX_KEYS} keys")
    keys: dict[str, SigningKey] = {}
    for index, entry in enumerate(entries):
        try:
            key = _signing_key(entry)
        except JwksError as exc:
            if strict:
                raise JwksError(f"key #{index + 1} {exc}") from None
            log.warning("skipping JWKS key #%d: %s", index + 1, exc)
            continue
        if key is None:
            continue
        if key.kid in keys:
            # Which of two keys a token means would be a guess.
            raise JwksError(f"key id {key.kid[:32]!r} appears more than once")
        keys[key.kid] = key
    if not keys:
        raise JwksError("has no usable signing key (RSA or EC P-256, with a 'kid')")
    return keys


def load_jwks_file(path: str | Path) -> dict[str, SigningKey]:
    """Read and validate a JWKS file; JwksError says what is wrong (never the key material)."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_JWKS_BYTES + 1)
    except OSError as exc:
        raise JwksError(
            f"cannot read {str(path)!r}: {exc.strerror or type(exc).__name__}"
        ) from None
    if len(raw) > MAX_JWKS_BYTES:
        raise JwksError(f"is larger than {MAX_JWKS_BYTES} bytes")
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise JwksError("is not valid JSON") from None
    return parse_jwks(document, strict=True)


class StaticKeys:
    """Keys from a JWKS file, loaded once."""

    def __init__(self, keys: Mapping[str, SigningKey]) -> None:
        self._keys = dict(keys)

    @classmethod
    def from_file(cls, path: str | Path) -> StaticKeys:
        return cls(load_jwks_file(path))

    def cached(self, kid: str) -> SigningKey | None:
        return self._keys.get(kid)

    async def lookup(self, kid: str) -> SigningKey | None:
        return self._keys.get(kid)

    def retry_after(self, issued_at: float | None) -> float | None:
        """A file's keys never change while the gateway runs: an unknown kid stays unknown."""
        return None

    async def aclose(self) -> None:
        return None


class RemoteKeys:
    """Keys fetched from a JWKS URL, cached, refetched lazily when stale or on an unknown kid.

    During an outage the last good keys keep working (a provider being down must not log
    everyone out); only a question no cached key can answer raises KeysUnavailable.
    """

    def __init__(
        self,
        url: str,
        *,
        cache_s: float,
        refetch_s: float,
        timeout_s: float = FETCH_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = url
        # Logged instead of the URL: a query string may carry an access key.
        self._display = urlsplit(url)._replace(query="", fragment="").geturl()
        self._cache_s = cache_s
        self._refetch_s = refetch_s
        self._clock = clock
        self._keys: dict[str, SigningKey] = {}
        self._fetched_at: float | None = None
        # The same moment by the wall clock, to compare with a token's `iat`.
        self._fetched_wall: float | None = None
        self._attempted_at: float | None = None
        self._last_failed = False
        # One fetch at a time: concurrent handshakes with a new kid share it.
        self._lock = asyncio.Lock()
        # Redirects are not followed: the configured URL is the trust anchor.
        self._http = httpx.AsyncClient(timeout=timeout_s, follow_redirects=False)

    def cached(self, kid: str) -> SigningKey | None:
        return self._keys.get(kid)

    async def lookup(self, kid: str) -> SigningKey | None:
        """The key for `kid`, fetching first when needed and allowed; None if the provider
        does not know it. Raises KeysUnavailable when fetching failed and nothing is cached
        for `kid`."""
        if self._needs_fetch(kid) and self._may_fetch():
            async with self._lock:
                # Another coroutine may have fetched while this one waited for the lock.
                if self._needs_fetch(kid) and self._may_fetch():
                    await self._fetch()
        key = self._keys.get(kid)
        if key is None and self._last_failed:
            raise KeysUnavailable("the identity provider's keys could not be fetched")
        return key

    def retry_after(self, issued_at: float | None) -> float | None:
        """For a token whose kid `lookup` did not find: seconds until the next fetch, when that
        fetch may find the key, else None. It may when the refetch interval held the fetch back
        and the token was issued after the keys at hand were fetched (or says nothing of when
        it was issued): a key the provider published since, which a token signed right after
        a rotation uses. A token issued before the last fetch names a key the provider did not
        have: unknown for good. (`iat` is read before the signature is checked; a forged one
        changes only which refusal a forged token gets, never how often the keys are fetched.)
        """
        if self._attempted_at is None:
            return None
        left = self._refetch_s - (self._clock() - self._attempted_at)
        if left <= 0:
            return None
        if issued_at is not None and self._fetched_wall is not None:
            # `iat` is in whole seconds: one issued in the second of the fetch may be after it.
            if issued_at < int(self._fetched_wall):
                return None
        return left

    async def aclose(self) -> None:
        await self._http.aclose()

    def _needs_fetch(self, kid: str) -> bool:
        if kid not in self._keys or self._fetched_at is None:
            return True
        return self._clock() - self._fetched_at >= self._cache_s

    def _may_fetch(self) -> bool:
        return self._attempted_at is None or self._clock() - self._attempted_at >= self._refetch_s

    async def _fetch(self) -> None:
        self._attempted_at = self._clock()
        try:
            keys = parse_jwks(await self._download(), strict=False)
        except (httpx.HTTPError, JwksError, ValueError) as exc:
            self._last_failed = True
            # Neither the body nor the full URL is logged.
            log.warning(
                "fetching the JWKS from %s failed (%s); %s",
                self._display,
                _describe(exc),
                "keeping the cached keys" if self._keys else "no keys are cached",
            )
            return
        self._keys = keys
        self._fetched_at = self._clock()
        self._fetched_wall = time.time()
        self._last_failed = False
        log.info("fetched %d signing key(s) from %s", len(keys), self._display)

    async def _download(self) -> object:
        async with self._http.stream("GET", self._url) as response:
            if response.status_code != 200:
                raise JwksError(f"HTTP status {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    raise JwksError(f"response is larger than {MAX_JWKS_BYTES} bytes")
        try:
            return json.loads(bytes(body))
        except (ValueError, UnicodeDecodeError):
            raise JwksError("response is not valid JSON") from None


def _describe(exc: Exception) -> str:
    if isinstance(exc, JwksError):
        return str(exc)
    return type(exc).__name__


KeySource = StaticKeys | RemoteKeys
