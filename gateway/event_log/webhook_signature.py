"""Webhook signatures (docs/protocol.md §10): `v1=` and the hex HMAC-SHA256, keyed with
GATEWAY_WEBHOOK_SECRET, of `{Webhook-Timestamp}.{body}`.

The timestamp is signed with the body so a receiver that refuses old timestamps also refuses a
captured request replayed later; it dedupes on `Webhook-Id` for the retries it does accept.
"""

from __future__ import annotations

import hashlib
import hmac

SCHEME = "v1"


def signature(secret: str, timestamp: str, body: str) -> str:
    """The `Webhook-Signature` header value for one request."""
    mac = hmac.new(secret.encode(), f"{timestamp}.{body}".encode(), hashlib.sha256)
    return f"{SCHEME}={mac.hexdigest()}"


def verify(secret: str, timestamp: str, body: str, header: str) -> bool:
    """Whether any of the header's space-separated signatures is this body's (several may be
    sent while a secret is being rotated); compared in constant time."""
    expected = signature(secret, timestamp, body)
    return any(hmac.compare_digest(expected, candidate) for candidate in header.split())
