"""Where a profiled gateway spent its CPU: self time per package, from a cProfile dump.

    .venv/bin/python -m bench.profile_summary /tmp/prof/gateway-*.prof [--top 12]

Profiles come from running any part with BENCH_PROFILE_DIR set (docs/benchmarks.md). cProfile's
cumulative times are misleading for this server (coroutines are entered once per resumption and
SQLAlchemy's async layer runs statements in greenlets), but self time is not: summed per package
it says which layer the CPU went to. Start-up (imports) is reported apart, by the functions
that only run then (compile, unmarshal, module bodies).
"""

from __future__ import annotations

import argparse
import pstats
import sys
from collections import defaultdict
from pathlib import Path

IMPORT_FUNCTIONS = ("<built-in method builtins.compile>", "<built-in method marshal.loads>")
IDLE = "asyncio/runners.py"  # uvloop's wait for I/O is counted as Runner.run's self time


def layer(filename: str, function: str) -> str:
    if function in IMPORT_FUNCTIONS or function == "<module>" or "importlib" in filename:
        return "start-up (imports)"
    if filename.endswith(IDLE):
        return "event loop idle (waiting for I/O)"
    if filename == "~":
        return "builtins and C extensions"
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1].split("/", 1)[0]
    for package in ("gateway", "persistence", "bench"):
        if f"/{package}/" in filename:
            return package
    return "python stdlib"


def summary(paths: list[Path]) -> list[tuple[str, float]]:
    stats = pstats.Stats(*map(str, paths))
    totals: dict[str, float] = defaultdict(float)
    for (filename, _line, function), row in stats.stats.items():  # type: ignore[attr-defined]
        totals[layer(filename, function)] += row[2]  # tottime
    return sorted(totals.items(), key=lambda item: -item[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_summary")
    parser.add_argument("profiles", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=14)
    args = parser.parse_args(argv)
    rows = summary(args.profiles)
    busy = sum(t for name, t in rows if not name.startswith(("start-up", "event loop idle")))
    print(f"{'layer':40s} {'self s':>8s} {'of busy':>8s}")
    for name, seconds in rows[: args.top]:
        share = "" if name.startswith(("start-up", "event loop idle")) else f"{seconds / busy:.0%}"
        print(f"{name:40s} {seconds:8.2f} {share:>8s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
