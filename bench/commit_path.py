"""The event log's commit path alone: one streamed event appended and awaited, over and over.

    .venv/bin/python -m bench.commit_path [--commits 3000] [--rounds 3]
    .venv/bin/python -m bench.commit_path --instructions     # needs valgrind

One JSON line. Each commit is what a lightly loaded gateway does for every model delta: the
event queued (`EventLog.append`), the writer's transaction on a fresh SQLite file (head bump,
insert; through the Store's prepared statements), the event published to the bus, the future
resolved. No SDK, no socket.

`us_per_commit` is timed, and moves with the machine (a factor of three over a day here).
`--instructions` counts instead: the same loop runs twice under valgrind's callgrind, with a
tenth and with half of `--commits`, and the difference in instructions over the difference
in commits is what one commit costs, start-up and imports cancelled out, the same on any load
(a tenth and half of `--commits`: about four minutes).
It is the figure to compare two trees by when a change is smaller than the machine's noise.

`BENCH_GATEWAY_ROOT` imports `gateway/` and `persistence/` from another source tree (one with
this tree's `EventLog` and `Store`), as for the other parts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DELTA = {"message_id": "m_92e9a48bcd76a98d7e7ffd04", "delta": "one word of a story "}
WARMUP_COMMITS = 200


async def commit_loop(commits: int, rounds: int) -> list[float]:
    """Seconds per commit, the median of each round."""
    from gateway.event_log.bus import EventBus
    from gateway.event_log.writer import EventLog
    from persistence.backends import open_store
    from persistence.schema import migrate
    from persistence.threads import ThreadRepository

    medians: list[float] = []
    with tempfile.TemporaryDirectory(prefix="gateway-bench-commits-") as folder:
        store = open_store(f"sqlite:///{folder}/commits.db")
        try:
            await migrate(store)
            thread = await ThreadRepository(store).create(tenant="bench", owner="alice")
            log = EventLog(store, EventBus())
            await log.start()
            try:
                for _ in range(WARMUP_COMMITS):
                    await (await log.append(thread.thread_id, None, "message.delta", DELTA))
                for _ in range(rounds):
                    times = []
                    for _ in range(commits):
                        begin = time.perf_counter()
                        await (await log.append(thread.thread_id, None, "message.delta", DELTA))
                        times.append(time.perf_counter() - begin)
                    medians.append(statistics.median(times))
            finally:
                await log.close()
        finally:
            await store.close()
    return medians


def child(commits: int, rounds: int, *, callgrind_out: str | None = None) -> str:
    """Run the loop in a process of its own, this script run as a file so that `gateway/`
    comes from PYTHONPATH (BENCH_GATEWAY_ROOT); under callgrind with `callgrind_out`.
    Returns what it wrote to stderr (callgrind's summary) and prints nothing itself."""
    command = [sys.executable, str(Path(__file__)), "--child"]
    command += ["--commits", str(commits), "--rounds", str(rounds)]
    if callgrind_out is not None:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={callgrind_out}"]
        command += [sys.executable, str(Path(__file__)), "--child"]
        command += ["--commits", str(commits), "--rounds", str(rounds)]
    env = {**os.environ, "PYTHONPATH": os.environ.get("BENCH_GATEWAY_ROOT") or str(ROOT)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return done.stdout + done.stderr


def instructions(commits: int) -> int:
    """Instructions callgrind counts for a whole process of `commits` commits, one round."""
    with tempfile.TemporaryDirectory(prefix="gateway-bench-callgrind-") as folder:
        output = child(commits, 1, callgrind_out=f"{folder}/callgrind.out")
    match = re.search(r"I\s+refs:\s+([\d,]+)", output)
    if match is None:
        raise RuntimeError(f"no instruction count from callgrind:\n{output[-2000:]}")
    return int(match.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--commits", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions under callgrind"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(commit_loop(args.commits, args.rounds))))
        return 0

    from bench.common import emit, machine_info

    line: dict[str, Any] = {"part": "commit_path", "backend": "sqlite"}
    if args.instructions:
        short, long = max(args.commits // 10, 1), max(args.commits // 2, 5)
        # Two independent processes, one a core.
        with ThreadPoolExecutor(max_workers=2) as pool:
            low, high = pool.map(instructions, (short, long))
        line["instructions_per_commit"] = round((high - low) / (long - short))
        line["config"] = {"commits": [short, long], "tool": "valgrind --tool=callgrind"}
    else:
        medians = json.loads(child(args.commits, args.rounds).splitlines()[0])
        line["us_per_commit"] = [round(seconds * 1e6, 1) for seconds in medians]
        line["config"] = {"commits": args.commits, "rounds": args.rounds}
    line["gateway_root"] = os.environ.get("BENCH_GATEWAY_ROOT") or str(ROOT)
    line["machine"] = machine_info()
    emit(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
