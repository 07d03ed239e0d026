"""Identifiers: a short type prefix and 128 random bits, URL-safe."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"
