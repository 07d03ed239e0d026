"""The bare SDK's own share of figure 4c: from a paused state to the approved call's output.

    .venv/bin/python -m bench.bare_sdk_resume [RUNS]

Figure 4c's demo run (`refund order 42 for 30`) is run once by `Runner.run_streamed` with the
offline demo model to its approval pause, and its state kept as text. Then, `RUNS` times: the
state restored (`RunState.from_string`), its call approved, and the run streamed on until the
approved call's output (`tool_call_output_item`) comes out of `stream_events()`, and to its end.
No store, no session, no sockets: what any gateway built on the SDK pays between a decision and
the call's output, beside what the gateway adds (docs/benchmarks.md, PostgreSQL). The gateway
restores a pause in advance (gateway/run_lifecycle/restored_checkpoints.py), so its figure 4c
pays the second figure, not the first. On uvloop, like the gateway. Prints one JSON line.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import uvloop

from bench.common import emit, latency_summary, report_line
from bench.core import REFUND_INPUT

WARMUP = 5


async def measure(runs: int) -> dict[str, Any]:
    from agents import RunConfig, Runner
    from agents.run_state import RunState

    from gateway.agents.demo.assistant import OfflineModelProvider, build_demo_agent

    agent = build_demo_agent()
    config = RunConfig(model_provider=OfflineModelProvider(0), tracing_disabled=True)
    paused = Runner.run_streamed(agent, REFUND_INPUT, run_config=config)
    async for _ in paused.stream_events():
        pass
    if not paused.interruptions:
        raise RuntimeError("the demo run did not pause for approval")
    saved = paused.to_state().to_string()
    restores: list[float] = []
    to_output: list[float] = []
    to_end: list[float] = []
    for attempt in range(WARMUP + runs):
        began = time.perf_counter()
        state = await RunState.from_string(agent, saved)
        restored = time.perf_counter()
        for call in state.get_interruptions():
            state.approve(call)
        result = Runner.run_streamed(agent, state, run_config=config)
        output: float | None = None
        async for event in result.stream_events():
            if (
                output is None
                and event.type == "run_item_stream_event"
                and event.item.type == "tool_call_output_item"
            ):
                output = time.perf_counter()
        ended = time.perf_counter()
        if output is None:
            raise RuntimeError("the approved call gave no output")
        if attempt >= WARMUP:
            restores.append(restored - began)
            to_output.append(output - restored)
            to_end.append(ended - restored)
    return {
        "figure": "4c, the bare SDK's share",
        "input": REFUND_INPUT,
        "restore": latency_summary(restores),
        "approve_to_tool_output": latency_summary(to_output),
        "approve_to_run_end": latency_summary(to_end),
        "config": {"runs": runs, "warmup_runs": WARMUP, "model": "offline demo, 0 ms a delta"},
    }


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    emit(report_line("bare-sdk-resume", "none", uvloop.run(measure(runs))))


if __name__ == "__main__":
    main()
