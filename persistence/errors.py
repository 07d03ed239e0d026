"""Storage errors as the gateway sees them, each with the protocol code a client is answered
with (gateway/protocol/error_codes.py)."""

from __future__ import annotations

from gateway.protocol.error_codes import CodedError, ErrorCode


class StorageUnavailable(CodedError, RuntimeError):
    """The database could not complete an operation; nothing was changed, retry later.

    The client is told only that (`unavailable`); what failed, the message it is raised with,
    is for the log (`str()`).
    """

    CODE = ErrorCode.UNAVAILABLE

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail)
        self.message = "storage is unavailable; nothing was changed"


class StaleWrite(CodedError, RuntimeError):
    """A compare-and-swap lost: the row moved on since it was read. Each caller that expects it
    answers with its own `conflict`; one that escapes is a fault (its message holds only ids).
    """
