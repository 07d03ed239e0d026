"""A thread's title (docs/protocol.md §8 "Threads"): its first input unless someone renames it."""

from __future__ import annotations

import re

from gateway.protocol.error_codes import ErrorCode, GatewayError

# A title a list can show on one line; a rename may be longer, up to the column's width.
DEFAULT_TITLE_CHARS = 80
MAX_TITLE_CHARS = 200
# White space: Python's, and JavaScript's (which adds U+FEFF), so a title the API document's
# pattern accepts is one this accepts.
_SPACE = re.compile(r"[\s\ufeff]+")
# The same for the API document: at least one character that is white space in neither.
TITLE_PATTERN = r"[^\s\x1c-\x1f\x85]"


def _one_line(text: str) -> str:
    return _SPACE.sub(" ", text).strip(" ")


def default_title(text: str) -> str:
    """The first input, on one line, cut at `DEFAULT_TITLE_CHARS` with an ellipsis."""
    line = _one_line(text)
    if len(line) <= DEFAULT_TITLE_CHARS:
        return line
    return line[: DEFAULT_TITLE_CHARS - 1].rstrip() + "…"


def checked_title(value: object) -> str:
    """A title a client asked for: a string of at most `MAX_TITLE_CHARS` characters with
    something besides white space, put on one line; else `bad_request`."""
    if not isinstance(value, str):
        raise GatewayError(ErrorCode.BAD_REQUEST, "title must be a string")
    title = _one_line(value)
    if not title or len(value) > MAX_TITLE_CHARS:
        raise GatewayError(
            ErrorCode.BAD_REQUEST,
            f"title must have 1 to {MAX_TITLE_CHARS} characters besides white space",
        )
    return title
