"""Which pytest-xdist worker this process is, so each worker's tests name their own databases,
Redis prefixes and ports: two workers never share one, whatever their tests do at once."""

from __future__ import annotations

import os


def worker_id() -> str:
    """`gw0`, `gw1`, ... under `pytest -n N`; `main` in a run without workers."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def worker_index() -> int:
    """0 for `gw0` and for a run without workers, 1 for `gw1`, ..."""
    name = worker_id()
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0
