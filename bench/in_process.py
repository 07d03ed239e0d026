"""The parts that measure the stores in the benchmark's own process (`bench.store_call`,
`bench.fenced_batch`): on uvloop, against a fresh database, one JSON line.

This module imports nothing of the gateway's: with `BENCH_GATEWAY_ROOT` set, that tree is put
first on the import path before anything of `gateway/` or `persistence/` is imported, so the
part measures the other tree's stores (bench/common.py, which imports the gateway, is imported
after it too). The part's own `measure` imports them when it runs.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.common import Backend

# bench/common.py's `GATEWAY_ROOT_ENV`, which cannot be imported before the path is set.
GATEWAY_ROOT_ENV = "BENCH_GATEWAY_ROOT"


def run_part(
    part: str,
    backend: Backend,
    database_name: str,
    measure: Callable[[str], Awaitable[dict[str, Any]]],
) -> None:
    """Print `part`'s line: `measure(url)` of a fresh `backend` database named after
    `database_name`, dropped afterwards."""
    root = os.environ.get(GATEWAY_ROOT_ENV)
    if root:
        sys.path.insert(0, root)
    import uvloop

    from bench.common import emit, fresh_database, machine_info

    async def run() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix=f"gateway-bench-{database_name}-") as folder:
            async with fresh_database(backend, Path(folder), database_name) as url:
                return await measure(url)

    figures = uvloop.run(run())
    emit({"part": part, "backend": backend, **figures, "machine": machine_info()})
