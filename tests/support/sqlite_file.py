"""Statements on a gateway's SQLite file from the test process, beside a running server."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any


def sql(db_path: Path, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """One statement, committed at once; WAL lets it run while the gateway holds the file."""
    with contextlib.closing(sqlite3.connect(db_path, timeout=10)) as db, db:
        return db.execute(statement, params).fetchall()
