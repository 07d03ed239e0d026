"""Run `python -m gateway ...` with its event loop traced, and write the trace on SIGTERM.

    python bench/traced_gateway.py OUT.pickle serve --port 0

cProfile says how much CPU each function used, not what the loop was doing while a request
waited: which callbacks ran between a frame's arrival and its answer, in what order, and where
the loop sat idle. Here every loop callback is recorded (start, end, the task's coroutine or the
callback's name), with each text frame received (its first 120 characters) and each write to
a socket (its first 300 bytes). `python -m bench.loop_trace_summary` reads the trace back.

Tracing needs the standard asyncio loop (uvloop's callbacks cannot be wrapped), so uvloop is
kept from loading: the figures are then the asyncio loop's, and compare only with another trace.
As with bench/profiled_gateway.py, tracing starts on SIGUSR1 (start-up stays out) and the
gateway is imported from PYTHONPATH (BENCH_GATEWAY_ROOT).
"""

from __future__ import annotations

import asyncio
import asyncio.selector_events
import importlib.util
import pickle
import sys
import time
from pathlib import Path
from typing import Any


def _sibling(name: str) -> Any:
    """A module of this folder, loaded from its file: this one runs as a script under `-P`
    (bench/ stays off sys.path, where bench/ag_ui.py would shadow the `ag_ui` package), so
    that the gateway, and only it, comes from PYTHONPATH."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_recorded = _sibling("profiled_gateway").run_recorded

# ("cb", start, end, name) | ("recv", at, text) | ("write", at, data)
Record = tuple[Any, ...]


class LoopTrace:
    def __init__(self) -> None:
        self.records: list[Record] = []
        self.on = False

    def install(self) -> None:
        """Wrap the loop's callbacks, the sockets' writes and the WebSocket text frames."""
        from uvicorn.protocols.websockets.websockets_sansio_impl import (
            WebSocketsSansIOProtocol,
        )

        trace, clock = self, time.perf_counter
        handle_run = asyncio.events.Handle._run
        transport: Any = asyncio.selector_events._SelectorSocketTransport  # type: ignore[attr-defined]
        write, handle_text = transport.write, WebSocketsSansIOProtocol.handle_text

        def traced_run(handle: asyncio.events.Handle) -> None:
            if not trace.on:
                return handle_run(handle)
            started = clock()
            try:
                return handle_run(handle)
            finally:
                trace.records.append(("cb", started, clock(), callback_name(handle)))

        def traced_write(self: Any, data: Any) -> None:
            if trace.on:
                trace.records.append(("write", clock(), bytes(data[:300])))
            write(self, data)

        def traced_text(self: Any, event: Any) -> None:
            if trace.on:
                trace.records.append(
                    ("recv", clock(), bytes(event.data[:120]).decode(errors="replace"))
                )
            handle_text(self, event)

        asyncio.events.Handle._run = traced_run  # type: ignore[method-assign, assignment]
        transport.write = traced_write
        # What Python 3.11's `writelines` does; later versions send the chunks without `write`.
        transport.writelines = lambda self, chunks: traced_write(self, b"".join(chunks))
        WebSocketsSansIOProtocol.handle_text = traced_text  # type: ignore[method-assign]


def callback_name(handle: asyncio.events.Handle) -> str:
    callback = handle._callback  # type: ignore[attr-defined]
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        return "task " + getattr(owner.get_coro(), "__qualname__", "?")
    return getattr(callback, "__qualname__", type(callback).__name__)


def main(argv: list[str]) -> int:
    out, args = argv[0], argv[1:]
    sys.modules["uvloop"] = None  # type: ignore[assignment]  # uvicorn falls back to asyncio
    trace = LoopTrace()
    trace.install()

    def start() -> None:
        trace.on = True

    def finish() -> None:
        trace.on = False
        with open(out, "wb") as file:
            pickle.dump(trace.records, file)

    return run_recorded(args, start, finish)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
