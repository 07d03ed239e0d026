"""Long lists cut for SQL statements that bind one value (or pair) per item.

Databases cap the bound parameters of one statement (SQLite builds before 3.32: 999), so
statements over many threads or leases go in slices; each caller sizes them for its own
values per item.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


def slices(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """`items` in consecutive slices of at most `size` (none for an empty sequence)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]
