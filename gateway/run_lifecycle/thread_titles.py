"""A thread's title (docs/protocol.md §8 "Threads"): its first input unless someone renames it."""

from __future__ import annotations

from gateway.protocol.error_codes import GatewayError
from gateway.protocol.frames import ErrorCode

# A title a list can show on one line; a rename may be longer, up to the column's width.
DEFAULT_TITLE_CHARS = 80
MAX_TITLE_CHARS = 200


def default_title(text: str) -> str:
    """The first input, on one line, cut at `DEFAULT_TITLE_CHARS` with an ellipsis."""
    line = " ".join(text.split())
    if len(line) <= DEFAULT_TITLE_CHARS:
        return line
    return line[: DEFAULT_TITLE_CHARS - 1].rstrip() + "…"


def checked_title(value: object) -> str:
    """A title a client asked for: a string with something to show, on one line, at most
    `MAX_TITLE_CHARS` characters once its whitespace is collapsed; else `bad_request`."""
    if not isinstance(value, str):
        raise GatewayError(ErrorCode.BAD_REQUEST, "title must be a string")
    title = " ".join(value.split())
    if not title or len(title) > MAX_TITLE_CHARS:
        raise GatewayError(
            ErrorCode.BAD_REQUEST,
            f"title must have 1 to {MAX_TITLE_CHARS} characters besides white space",
        )
    return title
