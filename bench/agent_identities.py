"""What the SDK's agent identities cost a checkpoint, with and without the gateway's shortcut.

    .venv/bin/python -m bench.agent_identities [REPS]

Two graphs paused at an approval: the demo's one agent (`refund order 42 for 30`), and a triage
agent with four specialists to hand off to, three tools each (one needing approval), long
instructions and model settings, driven by the SDK's ScriptedModel. For each, `REPS` times and
alternating: the state's `to_json()` (what every checkpoint's serialisation starts with) and
`RunState.from_string` (every restore), with the SDK's own sort key of agents and with
gateway/agents/identity_shortcut.py's. Medians in µs, and how many signatures each computed.
In-process, on uvloop. Prints one JSON line (docs/benchmarks.md, "The SDK's agent identities").
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop

from bench.common import emit, report_line
from bench.core import REFUND_INPUT

SPECIALISTS = 4


def specialists_graph() -> Any:
    from agents import Agent, ModelSettings, function_tool
    from agents.testing import ModelStep, ScriptedModel, function_call

    def tools(prefix: str) -> list[Any]:
        made = []
        for number in range(3):

            @function_tool(name_override=f"{prefix}_tool_{number}", needs_approval=number == 0)
            def tool(value: str) -> str:
                return value

            made.append(tool)
        return made

    specialists = [
        Agent(
            name=f"specialist_{number}",
            instructions="You are a specialist of this desk. " * 40,
            tools=tools(f"specialist_{number}"),
            model_settings=ModelSettings(temperature=0.2),
        )
        for number in range(SPECIALISTS)
    ]
    return Agent(
        name="triage",
        instructions="Route each request to the right specialist. " * 40,
        handoffs=specialists,
        tools=tools("triage"),
        model=ScriptedModel(
            [ModelStep(output=[function_call("triage_tool_0", {"value": "1"}, call_id="c1")])]
        ),
    )


async def paused(agent: Any, text: str, config: Any) -> Any:
    from agents import Runner

    result = Runner.run_streamed(agent, text, run_config=config)
    async for _ in result.stream_events():
        pass
    if not result.interruptions:
        raise RuntimeError("the run did not pause for approval")
    return result.to_state()


async def measure(reps: int) -> dict[str, Any]:
    from agents import RunConfig
    from agents import _run_state_agent_identity as identities
    from agents.run_state import RunState

    from gateway.agents import identity_shortcut
    from gateway.agents.demo.assistant import OfflineModelProvider, build_demo_agent

    sdk_key = identity_shortcut.sdk_sort_key()
    keys = {
        "sdk": sdk_key,
        "shortcut": identity_shortcut.shortcut_sort_key(sdk_key, identities._iter_agent_graph),
    }
    signature = identities._agent_identity_signature
    signed = [0]

    def counted(agent: Any) -> str:
        signed[0] += 1
        return signature(agent)

    identities._agent_identity_signature = counted
    demo, triage = build_demo_agent(), specialists_graph()
    offline = RunConfig(model_provider=OfflineModelProvider(0), tracing_disabled=True)
    scripted = RunConfig(tracing_disabled=True)
    graphs = {
        "demo": (demo, await paused(demo, REFUND_INPUT, offline)),
        f"triage_and_{SPECIALISTS}_specialists": (triage, await paused(triage, "go", scripted)),
    }
    figures: dict[str, Any] = {}
    try:
        for name, (agent, state) in graphs.items():
            saved = state.to_string()

            async def to_json(state: Any = state) -> None:
                state.to_json()

            async def restore(agent: Any = agent, saved: str = saved) -> None:
                await RunState.from_string(agent, saved)

            steps: dict[str, Callable[[], Awaitable[None]]] = {
                "to_json": to_json,
                "from_string": restore,
            }
            times: dict[str, dict[str, list[float]]] = {k: {s: [] for s in steps} for k in keys}
            signatures: dict[str, dict[str, int]] = {k: {} for k in keys}
            for rep in range(reps + 3):
                for key_name, key in keys.items():
                    identities._agent_identity_sort_key = key
                    for step, call in steps.items():
                        signed[0] = 0
                        began = time.perf_counter()
                        await call()
                        spent = time.perf_counter() - began
                        if rep >= 3:  # warm-up
                            times[key_name][step].append(spent)
                            signatures[key_name][step] = signed[0]
            figures[name] = {
                key_name: {
                    f"{step}_us": round(statistics.median(spent) * 1e6, 1)
                    for step, spent in by_step.items()
                }
                | {f"{step}_signatures": n for step, n in signatures[key_name].items()}
                for key_name, by_step in times.items()
            }
    finally:
        identities._agent_identity_signature = signature
        identities._agent_identity_sort_key = sdk_key
    return {
        "part": "agent-identities",
        "graphs": figures,
        "config": {"reps": reps, "alternating": "sdk, shortcut"},
    }


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    figures = uvloop.run(measure(reps))
    emit(report_line(figures.pop("part"), "none", figures))


if __name__ == "__main__":
    main()
