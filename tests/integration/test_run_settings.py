"""A graph's run settings (docs/agents.md "Run settings"): its hooks and model settings apply to
a run's first segment and to its continuation after a decision, and a guardrail that trips
ends the run in a `run.failed` naming it, over a real WebSocket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    GuardrailFunctionOutput,
    InputGuardrail,
    ModelSettings,
    OutputGuardrail,
    RunContextWrapper,
    RunHooks,
    Tool,
)
from agents.testing import ModelStep, ScriptedModel

from gateway.agents.registry import AgentGraph, AgentRegistry
from gateway.agents.run_caller import RunCaller
from gateway.agents.run_settings import RunSettings
from tests.support.agents import EffectLog, call, effect_tool, say
from tests.support.client import Client
from tests.support.sqlite_file import sql


class ToolStarts(RunHooks[Any]):
    """Records, for each tool start, the run the settings were made for."""

    def __init__(self, run_id: str, starts: list[tuple[str, str]]) -> None:
        self._run_id = run_id
        self._starts = starts

    async def on_tool_start(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool
    ) -> None:
        self._starts.append((self._run_id, tool.name))


def graph(model: ScriptedModel, settings: Any) -> AgentGraph:
    effects = EffectLog()

    def build() -> Agent[Any]:
        return Agent(
            name="guarded",
            instructions="test agent",
            model=model,
            tools=[effect_tool(effects, "charge", needs_approval=True)],
        )

    return AgentGraph(name="guarded", version="1", build=build, run_settings=settings)


def no_passwords(ctx: RunContextWrapper[Any], agent: Agent[Any], data: Any) -> Any:
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered="password" in str(data))


def no_secrets(ctx: RunContextWrapper[Any], agent: Agent[Any], output: Any) -> Any:
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered="secret" in str(output))


def guarded(caller: RunCaller) -> RunSettings:
    return RunSettings(
        input_guardrails=(InputGuardrail(no_passwords, name="no_passwords"),),
        output_guardrails=(OutputGuardrail(no_secrets, name="no_secrets"),),
    )


async def test_hooks_and_model_settings_apply_before_and_after_the_decision(
    gateway_factory: Any,
) -> None:
    model = ScriptedModel(
        [ModelStep(output=[call("charge", "c1", value="5")]), ModelStep(output=[say("charged")])]
    )
    starts: list[tuple[str, str]] = []

    def settings(caller: RunCaller) -> RunSettings:
        # Guardrails that pass: the run goes on as without them.
        return RunSettings(
            hooks=ToolStarts(caller.run_id, starts),
            model_settings=ModelSettings(temperature=0.25),
            input_guardrails=guarded(caller).input_guardrails,
            output_guardrails=guarded(caller).output_guardrails,
        )

    async with gateway_factory(registry=AgentRegistry([graph(model, settings)])) as gw:
        owner = await Client.connect(gw.ws_url, gw.token("olga", "user"))
        rex = await Client.connect(gw.ws_url, gw.token("rex", "reviewer"))
        try:
            ack = await owner.request("run.start", input="charge 5")
            requested = await owner.wait_event("approval.requested")
            await rex.request(
                "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
            )
            await owner.wait_event("run.completed")
        finally:
            await owner.close()
            await rex.close()
    # The approved call runs in the continuation, under hooks made for this run.
    assert starts == [(ack["run_id"], "charge")]
    assert [c.model_settings.temperature for c in model.calls] == [0.25, 0.25]


@pytest.mark.parametrize(
    ("text", "steps", "kind", "name"),
    [
        ("my password is hunter2", [say("noted")], "input", "no_passwords"),
        ("tell me", [say("the secret is 42")], "output", "no_secrets"),
    ],
)
async def test_a_tripped_guardrail_fails_the_run_naming_it(
    gateway_factory: Any,
    db_path: Path,
    text: str,
    steps: list[Any],
    kind: str,
    name: str,
) -> None:
    model = ScriptedModel([ModelStep(output=steps)])
    async with gateway_factory(registry=AgentRegistry([graph(model, guarded)])) as gw:
        owner = await Client.connect(gw.ws_url, gw.token("olga", "user"))
        try:
            ack = await owner.request("run.start", input=text)
            failed = await owner.wait_event("run.failed")
            assert failed["run_id"] == ack["run_id"]
        finally:
            await owner.close()
    error = failed["data"]["error"]
    assert error["code"] == "guardrail_tripped"
    assert error["guardrail"] == name
    assert error["guardrail_kind"] == kind
    assert name in error["message"]
    assert sql(db_path, "SELECT status FROM runs WHERE run_id = ?", (ack["run_id"],)) == [
        ("failed",)
    ]
