"""The size of a text frame on the wire: what every byte budget (a connection's outbox, a feed's
queue, a checkpoint's metric) counts."""

from __future__ import annotations


def encoded_size(text: str) -> int:
    """UTF-8 bytes of `text`; `isascii` is constant-time, so most frames cost nothing."""
    return len(text) if text.isascii() else len(text.encode())
