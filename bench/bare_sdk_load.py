"""The bare SDK under figure 7's load: the CPU the Agents SDK itself spends per model delta.

    .venv/bin/python -m bench.bare_sdk_load RUNS DELTA_MS

`RUNS` demo story runs at once in this process, each streamed by `Runner.run_streamed` with the
offline demo model at `DELTA_MS` per delta and consumed with `stream_events()`: what any
gateway built on the SDK pays before it stores or sends anything. On uvloop, the loop the
gateway's server runs on. Prints one JSON line: the model deltas, the process's CPU seconds over
the runs (after one warm-up run) and the CPU per delta. Figure 7 runs it right after the
gateway, so both are measured in the same run.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import orjson
import uvloop

from bench.common import STORY_INPUT

TEXT_DELTA = "response.output_text.delta"


async def story_run(agent: Any, delay_ms: int) -> int:
    """One story run consumed to its end; the model's text deltas it streamed."""
    from agents import RunConfig, Runner

    from gateway.agents.demo.assistant import OfflineModelProvider

    result = Runner.run_streamed(
        agent,
        STORY_INPUT,
        run_config=RunConfig(model_provider=OfflineModelProvider(delay_ms), tracing_disabled=True),
    )
    deltas = 0
    async for event in result.stream_events():
        if event.type == "raw_response_event" and event.data.type == TEXT_DELTA:
            deltas += 1
    return deltas


async def measure(runs: int, delay_ms: int) -> dict[str, Any]:
    from gateway.agents.demo.assistant import build_demo_agent

    agent = build_demo_agent()
    await story_run(agent, 0)  # imports and first-use allocations
    cpu_before = time.process_time()
    counts = await asyncio.gather(*(story_run(agent, delay_ms) for _ in range(runs)))
    cpu = time.process_time() - cpu_before
    deltas = sum(counts)
    return {
        "runs": runs,
        "model_deltas": deltas,
        "cpu_s": round(cpu, 3),
        "cpu_us_per_model_delta": round(cpu * 1e6 / max(1, deltas), 1),
    }


def main() -> None:
    runs, delay_ms = int(sys.argv[1]), int(sys.argv[2])
    print(orjson.dumps(uvloop.run(measure(runs, delay_ms))).decode())


if __name__ == "__main__":
    main()
