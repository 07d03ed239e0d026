"""An identity provider for tests: real RSA and EC keys, their JWKS, signed tokens, and a
local HTTP server (a thread running http.server on port 0) that serves the JWKS."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.support.ports import free_port


@dataclass
class KeyPair:
    kid: str
    algorithm: str
    private: Any

    @property
    def public(self) -> Any:
        return self.private.public_key()

    def jwk(self, **extra: Any) -> dict[str, Any]:
        if self.algorithm == "RS256":
            data = jwt.algorithms.RSAAlgorithm.to_jwk(self.public, as_dict=True)
        else:
            data = jwt.algorithms.ECAlgorithm.to_jwk(self.public, as_dict=True)
        return {**data, "kid": self.kid, "use": "sig", **extra}

    def public_pem(self) -> bytes:
        return self.public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def sign(
        self,
        claims: dict[str, Any],
        *,
        algorithm: str | None = None,
        kid: str | None = "",
    ) -> str:
        """A token signed with this key; `kid=""` means this key's own id, None none at all."""
        headers = {} if kid is None else {"kid": kid or self.kid}
        return jwt.encode(
            claims, self.private, algorithm=algorithm or self.algorithm, headers=headers
        )


def rsa_key(kid: str = "rsa-1", bits: int = 2048) -> KeyPair:
    return KeyPair(kid, "RS256", rsa.generate_private_key(public_exponent=65537, key_size=bits))


def ec_key(kid: str = "ec-1") -> KeyPair:
    return KeyPair(kid, "ES256", ec.generate_private_key(ec.SECP256R1()))


def jwks(*keys: KeyPair) -> dict[str, Any]:
    return {"keys": [key.jwk() for key in keys]}


def write_jwks(path: Path, document: object) -> Path:
    path.write_text(json.dumps(document))
    return path


def claims(**overrides: Any) -> dict[str, Any]:
    """Valid gateway claims for ten minutes; `...` as a value drops that claim."""
    now = int(time.time())
    base: dict[str, Any] = {
        "sub": "alice",
        "tenant": "acme",
        "roles": ["user"],
        "iat": now,
        "exp": now + 600,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not ...}


@dataclass
class JwksServer:
    """What the served endpoint answers; tests change `document` or `status` as they go."""

    document: object
    status: int = 200
    requests: int = 0
    port: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/.well-known/jwks.json"


@contextlib.contextmanager
def serve_jwks(document: object) -> Iterator[JwksServer]:
    state = JwksServer(document)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with state._lock:
                state.requests += 1
                status, body = state.status, json.dumps(state.document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, name="jwks-server", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def closed_port_url() -> str:
    """A loopback URL nothing listens on: a port of the worker's own block that was just free
    (tests/support/ports.py), which no other worker's server takes meanwhile."""
    return f"http://127.0.0.1:{free_port()}/jwks.json"
