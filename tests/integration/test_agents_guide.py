"""The example of docs/agents.md (docs/examples/support_agents.py), run as written: its graph
serves a run whose gated call waits for a reviewer with the role it names, shows the masked
argument to the owner, continues after the approval with the call run once, and keeps its
typed context, with the caller and who approved, through the checkpoint."""

from __future__ import annotations

import importlib.util
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from agents import Agent
from agents.testing import ModelStep, ScriptedModel

from gateway.agents.registry import AgentRegistry
from gateway.auth.access import TokenVerifier
from tests.support.agents import call, say
from tests.support.client import Client, ProtocolFailure
from tests.support.gateway import ROOT, TEST_SECRET

EXAMPLE = ROOT / "docs" / "examples" / "support_agents.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("support_agents", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered first, as an import would: its dataclass resolves its annotations there.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def test_the_guides_support_agent_pauses_masks_and_continues(
    gateway_factory: Callable[..., Any], db_path: Path
) -> None:
    example = load_example()
    assert example.registry.names() == ["support"]
    model = ScriptedModel(
        [
            ModelStep(output=[call("cancel_subscription", "call_c1", customer_id="c-42")]),
            ModelStep(output=[say("Done: the subscription is cancelled.")]),
        ]
    )

    def build() -> Agent[Any]:
        # The example's agent as written, on a scripted model instead of a real one.
        return example.build_support_agent().clone(model=model)

    registry = AgentRegistry([example.support_graph(build)])
    async with gateway_factory(registry=registry) as gw:
        # The test issues tokens with the graph's `billing` role, as the gateway accepts them.
        gw.verifier = TokenVerifier(TEST_SECRET, custom_roles=registry.reviewer_role_names())
        owner = await Client.connect(gw.ws_url, gw.token("olga", "user"))
        plain = await Client.connect(gw.ws_url, gw.token("rex", "reviewer"))
        billing = await Client.connect(gw.ws_url, gw.token("bea", "reviewer", "billing"))
        try:
            started = await owner.request(
                "run.start", agent="support", input="cancel my subscription"
            )
            requested = await owner.wait_event("approval.requested")
            assert requested["data"]["arguments"] == {"customer_id": "***"}
            approval_id = requested["data"]["approval_id"]
            await owner.wait_event("run.paused")

            with pytest.raises(ProtocolFailure) as refused:
                await plain.request("approval.decide", approval_id=approval_id, decision="approve")
            assert refused.value.frame["code"] == "forbidden"
            await billing.request("approval.decide", approval_id=approval_id, decision="approve")

            output = await owner.wait_event("tool.output")
            # The tool read who asked and who approved from the run context.
            assert output["data"]["output"] == (
                "Subscription of c-42 cancelled for olga (tenant acme), approved by bea."
            )
            done = await owner.wait_event("run.completed")
            assert done["run_id"] == started["run_id"]
        finally:
            for client in (owner, plain, billing):
                await client.close()

    with sqlite3.connect(db_path) as db:
        operations = db.execute("SELECT status FROM operations").fetchall()
        states = [row[0] for row in db.execute("SELECT state FROM checkpoints").fetchall()]
    assert operations == [("done",)]
    # The typed context went into the checkpoint as its serializer wrote it.
    assert any('"tier": "standard"' in s or '"tier":"standard"' in s for s in states)
