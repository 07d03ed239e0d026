"""Where a request's latency went, from a loop trace (bench/traced_gateway.py).

    .venv/bin/python -m bench.loop_trace_summary TRACE.pickle [--request approval.decide]
        [--until run.resumed] [--skip 2] [--top 12]

For each text frame received whose `type` is `--request`, the window runs from its arrival to
the first frame written afterwards that carries the event `--until`. Reported over the
windows (p50 and mean, ms): the time to the request's `ack`, to the `--until` event, how much of
the window the loop spent running callbacks and how much idle (waiting for a thread or for I/O),
and the callbacks that ran in it, by name (ms per window and how many). Two traces of the same
benchmark on two trees say which step got slower; on one tree, what a request waits for.
"""

from __future__ import annotations

import argparse
import bisect
import pickle
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Window:
    to_ack: float
    to_until: float
    busy: float
    callbacks: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)


def windows(records: list[tuple[Any, ...]], request: str, until: str) -> list[Window]:
    records = sorted(records, key=lambda record: record[1])
    writes = [r for r in records if r[0] == "write"]
    write_times = [r[1] for r in writes]
    callbacks = [r for r in records if r[0] == "cb"]
    callback_starts = [r[1] for r in callbacks]
    wanted, until_marker = f'"type":"{request}"', f'"event":"{until}"'.encode()
    found = []
    for record in records:
        if record[0] != "recv" or wanted not in record[2].replace(" ", ""):
            continue
        start = record[1]

        def first(marker: bytes, start: float = start) -> float | None:
            for written in writes[bisect.bisect_left(write_times, start) :]:
                if marker in written[2]:
                    return float(written[1])
            return None

        ack, end = first(b'"type":"ack"'), first(until_marker)
        if ack is None or end is None:
            continue
        window = Window(ack - start, end - start, 0.0)
        # From the callback the frame arrived in (it may have started a little before).
        index = max(bisect.bisect_right(callback_starts, start) - 1, 0)
        for _, began, ended, name in callbacks[index:]:
            if began >= end:
                break
            overlap = min(ended, end) - max(began, start)
            if overlap > 0:
                window.busy += overlap
                window.callbacks[name] += overlap
                window.counts[name] += 1
        found.append(window)
    return found


def report(found: list[Window], top: int) -> str:
    def line(label: str, values: list[float]) -> str:
        return (
            f"{label:24s} p50 {statistics.median(values) * 1000:8.3f}  "
            f"mean {statistics.mean(values) * 1000:8.3f} ms"
        )

    lines = [
        f"{len(found)} requests",
        line("to the ack", [w.to_ack for w in found]),
        line("to the event", [w.to_until for w in found]),
        line("loop busy", [w.busy for w in found]),
        line("loop idle", [w.to_until - w.busy for w in found]),
        "callbacks in the window (ms per request, how many):",
    ]
    totals: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for window in found:
        totals.update(window.callbacks)
        counts.update(window.counts)
    for name, seconds in totals.most_common(top):
        lines.append(
            f"  {seconds / len(found) * 1000:7.3f}  {counts[name] / len(found):5.1f}  {name}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loop_trace_summary")
    parser.add_argument("trace", type=Path)
    parser.add_argument("--request", default="approval.decide")
    parser.add_argument("--until", default="run.resumed")
    parser.add_argument("--skip", type=int, default=2, help="first requests left out (warm-up)")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    with args.trace.open("rb") as file:
        records = pickle.load(file)
    found = windows(records, args.request, args.until)[args.skip :]
    if not found:
        print(f"no {args.request} answered by {args.until} in {args.trace}", file=sys.stderr)
        return 1
    print(report(found, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
