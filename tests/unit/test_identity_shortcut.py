"""The shortcut of the SDK's agent identities (gateway/agents/identity_shortcut.py) gives what
the SDK's own ranking gives, on graphs whose agents' names are their own and on graphs where
names are shared, and skips the signatures only where they rank nothing."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import agents
import orjson
import pytest
from agents import Agent, RunConfig, Runner
from agents import _run_state_agent_identity as identities
from agents.run_state import RunState

from gateway.agents import identity_shortcut
from gateway.agents.demo.assistant import OfflineModelProvider, build_demo_agent

REFUND = "refund order 42 for 30"


@pytest.fixture
def with_sort_key(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    def use(shortcut: bool) -> None:
        original = identity_shortcut.sdk_sort_key()
        key = (
            identity_shortcut.shortcut_sort_key(original, identities._iter_agent_graph)
            if shortcut
            else original
        )
        monkeypatch.setattr(identities, "_agent_identity_sort_key", key)

    return use


def graph_of_own_names() -> Agent[Any]:
    billing = Agent(name="billing", instructions="Bills.")
    shipping = Agent(name="shipping", instructions="Ships.")
    researcher = Agent(name="researcher", instructions="Looks things up.")
    return Agent(
        name="triage",
        instructions="Routes.",
        handoffs=[billing, shipping],
        tools=[researcher.as_tool(tool_name="research", tool_description="Research.")],
    )


def graph_with_shared_names() -> Agent[Any]:
    # Two agents named "helper" (one a handoff target, one behind a tool) and a handoff
    # target named like the root: the SDK ranks each pair by signature.
    helper_a = Agent(name="helper", instructions="Helps with A.")
    helper_b = Agent(name="helper", instructions="Helps with B.", handoff_description="B")
    root_twin = Agent(name="root", instructions="Another root.")
    return Agent(
        name="root",
        instructions="The root.",
        handoffs=[helper_b, root_twin],
        tools=[helper_a.as_tool(tool_name="help_a", tool_description="A.")],
    )


def identities_of(root: Agent[Any]) -> dict[str, Any]:
    """Everything the SDK derives from the ranking, by agent position in the graph."""
    order = {id(agent): index for index, agent in enumerate(identities._iter_agent_graph(root))}
    return {
        "map": {
            key: order[id(agent)]
            for key, agent in identities._build_agent_identity_map(root).items()
        },
        "keys": {
            order[agent_id]: key
            for agent_id, key in identities._build_agent_identity_keys_by_id(root).items()
        },
        "ambiguous": sorted(order[i] for i in identities._get_ambiguous_agent_ids(root)),
        "hook_ambiguity": identities._has_ambiguous_hook_identities(root),
    }


@pytest.mark.parametrize("build", [build_demo_agent, graph_of_own_names, graph_with_shared_names])
def test_the_shortcut_derives_every_identity_the_sdk_does(
    build: Callable[[], Agent[Any]], with_sort_key: Callable[[bool], None]
) -> None:
    root = build()
    with_sort_key(False)
    expected = identities_of(root)
    with_sort_key(True)
    assert identities_of(root) == expected


def test_shared_names_are_still_ranked_by_their_signatures(
    with_sort_key: Callable[[bool], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = graph_with_shared_names()
    signed: list[str] = []
    signature = identities._agent_identity_signature

    def counted(agent: Agent[Any]) -> str:
        signed.append(agent.name)
        return signature(agent)

    monkeypatch.setattr(identities, "_agent_identity_signature", counted)
    with_sort_key(True)
    keys = identities._build_agent_identity_map(root)
    # Only the agents that share a name were signed; the two helpers got ranks of their own.
    assert sorted(set(signed)) == ["helper", "root"]
    assert set(keys) == {"root", "root#2", "helper", "helper#2"}


async def paused_refund_state() -> RunState[Any, Any]:
    agent = build_demo_agent()
    config = RunConfig(model_provider=OfflineModelProvider(0), tracing_disabled=True)
    paused = Runner.run_streamed(agent, REFUND, run_config=config)
    async for _ in paused.stream_events():
        pass
    assert paused.interruptions, "the demo run did not pause for approval"
    return paused.to_state()


async def test_a_checkpoint_is_the_same_and_signs_no_agent(
    with_sort_key: Callable[[bool], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    state = await paused_refund_state()
    with_sort_key(False)
    expected = state.to_json()
    restored_expected = (await RunState.from_json(state._starting_agent, expected)).to_json()

    signed: list[str] = []
    signature = identities._agent_identity_signature
    monkeypatch.setattr(
        identities, "_agent_identity_signature", lambda a: signed.append(a.name) or signature(a)
    )
    with_sort_key(True)
    assert state.to_json() == expected
    restored = await RunState.from_json(state._starting_agent, expected)
    assert restored.to_json() == restored_expected
    for call in restored.get_interruptions():
        restored.approve(call)
    assert signed == []


def test_install_wraps_the_sdk_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(identities, "_agent_identity_sort_key", identity_shortcut.sdk_sort_key())
    assert identity_shortcut.install()
    installed = identities._agent_identity_sort_key
    assert identity_shortcut.install()
    assert identities._agent_identity_sort_key is installed
    assert getattr(installed, identity_shortcut._WRAPS) is identity_shortcut.sdk_sort_key()


def test_an_sdk_without_the_sort_key_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(identities, "_agent_identity_sort_key")
    assert not identity_shortcut.install()
    assert not hasattr(identities, "_agent_identity_sort_key")


def callers_in(package: Path, name: str) -> Iterator[str]:
    """The functions of `package` whose bodies refer to `name`."""
    for source in package.rglob("*.py"):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if function.name == name:
                continue
            if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(function)):
                yield f"{source.relative_to(package)}:{function.name}"


def test_the_sdk_ranks_agents_only_where_the_shortcut_was_proven() -> None:
    """The shortcut is exact because the sort key only ranks agents of one name and groups
    them (module docstring). An SDK release that uses it anywhere else must be read again."""
    package = Path(agents.__file__).parent
    assert set(callers_in(package, "_agent_identity_sort_key")) == {
        "_run_state_agent_identity.py:_build_agent_identity_map",
        "_run_state_agent_identity.py:_get_ambiguous_agent_ids",
    }


def twin_billing_graph(charged: list[str]) -> Agent[Any]:
    """Two agent-tools whose agents are both named `billing`; the second one's `charge`
    needs approval, so the run pauses inside the agent that shares its name."""
    from agents import function_tool
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    @function_tool(needs_approval=True)
    def charge(amount: str) -> str:
        charged.append(amount)
        return f"charged {amount}"

    quiet = Agent(
        name="billing",
        instructions="Answers.",
        model=ScriptedModel([ModelStep(output=[assistant_message("nothing to do")])]),
    )
    charging = Agent(
        name="billing",
        instructions="Charges.",
        model=ScriptedModel(
            [
                ModelStep(output=[function_call("charge", {"amount": "5"}, call_id="c_charge")]),
                ModelStep(output=[assistant_message("charged")]),
            ]
        ),
        tools=[charge],
    )
    return Agent(
        name="desk",
        instructions="Routes.",
        model=ScriptedModel(
            [
                ModelStep(output=[function_call("charge_it", {"input": "5"}, call_id="c_out")]),
                ModelStep(output=[assistant_message("done")]),
            ]
        ),
        # The charging agent comes first in the graph, but its signature ranks it second
        # ("Answers." sorts before "Charges."): only its signature names it `billing#2`.
        tools=[
            charging.as_tool(tool_name="charge_it", tool_description="Charges."),
            quiet.as_tool(tool_name="ask_quiet", tool_description="Quiet."),
        ],
    )


async def test_a_pause_inside_an_agent_that_shares_its_name_restores_and_goes_on(
    with_sort_key: Callable[[bool], None],
) -> None:
    charged: list[str] = []
    root = twin_billing_graph(charged)
    with_sort_key(False)
    paused = Runner.run_streamed(root, "charge 5")
    async for _ in paused.stream_events():
        pass
    assert [item.tool_name for item in paused.interruptions] == ["charge"]
    state = paused.to_state()
    expected = state.to_json()
    # The SDK told the two `billing` agents apart by their signatures.
    assert "billing#2" in orjson.dumps(expected).decode()

    with_sort_key(True)
    assert state.to_json() == expected
    restored = await RunState.from_json(root, expected)
    for item in restored.get_interruptions():
        restored.approve(item)
    resumed = Runner.run_streamed(root, restored)
    async for _ in resumed.stream_events():
        pass
    assert resumed.final_output == "done"
    assert charged == ["5"]
