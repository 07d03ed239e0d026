"""Storage errors as the gateway sees them."""

from __future__ import annotations


class StorageUnavailable(RuntimeError):
    """The database could not complete an operation; nothing was changed, retry later."""


class StaleWrite(RuntimeError):
    """A compare-and-swap lost: the row moved on since it was read."""
