"""Retry (docs/protocol.md §4 `run.retry`): a failed run goes on from its last checkpoint in a
new run. Only the turn it failed in is repeated, a side effect it already made is not made
again, the history the agent sees holds each item once, and the failed run stays failed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from agents import Agent, AgentHooks
from agents.testing import ModelStep, ScriptedModel
from agents.usage import Usage

from gateway.agents.registry import AgentGraph, AgentRegistry
from tests.support.agents import EffectLog, call, effect_tool, say, scripted_graph
from tests.support.client import Client, ProtocolFailure


def tokens(input_tokens: int, output_tokens: int) -> Usage:
    return Usage(
        requests=1,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=input_tokens + output_tokens,
    )


def model_down() -> ModelStep:
    return ModelStep.raise_error(RuntimeError("the model server is down"))


def item_kinds(model_input: Any) -> list[str]:
    """What a model call was given, one short label per item."""
    kinds = []
    for item in model_input:
        kind = item.get("type") or item.get("role")
        if kind == "function_call":
            kinds.append(f"call:{item['call_id']}")
        elif kind == "function_call_output":
            kinds.append(f"output:{item['call_id']}")
        else:
            content = item.get("content")
            if isinstance(content, list):
                content = "".join(str(part.get("text", "")) for part in content)
            kinds.append(f"{kind}:{content}")
    return kinds


async def test_a_failed_run_goes_on_from_its_last_turn(gateway_factory: Callable[..., Any]) -> None:
    """The tool of the first turn ran; the second model call failed. The retry repeats only
    that model call: the tool does not run again and the model sees its output once."""
    effects = EffectLog()
    graph, model = scripted_graph(
        "worker",
        [
            ModelStep(output=[call("lookup", "call_1", value="a")]),
            model_down(),
            ModelStep(output=[say("all done")]),
        ],
        effects,
    )
    async with gateway_factory(registry=AgentRegistry([graph])) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice", "user"))
        try:
            first = await alice.request("run.start", input="look it up")
            thread_id, failed_id = first["thread_id"], first["run_id"]
            await alice.wait_event("run.failed")
            retried = await alice.request("run.retry", run_id=failed_id)
            assert retried["retries"] == failed_id
            assert retried["thread_id"] == thread_id
            assert isinstance(retried["checkpoint_version"], int)
            await alice.wait_event("run.completed", final_output="all done")
            # The failed run stays failed; only the thread's last run can be retried.
            with pytest.raises(ProtocolFailure) as done:
                await alice.request("run.retry", run_id=retried["run_id"])
            assert done.value.code == "conflict"
            with pytest.raises(ProtocolFailure) as stale:
                await alice.request("run.retry", run_id=failed_id)
            assert stale.value.code == "conflict"
            events = alice.events_of(thread_id)
        finally:
            await alice.close()
    assert effects.count("lookup") == 1
    assert len(model.calls) == 3
    # The retried call sees the first turn exactly once, as the failed call did.
    assert item_kinds(model.calls[2].input) == item_kinds(model.calls[1].input)
    assert item_kinds(model.calls[2].input) == ["user:look it up", "call:call_1", "output:call_1"]
    starts = [e for e in events if e["event"] == "run.started"]
    assert starts[-1]["run_id"] == retried["run_id"]
    assert starts[-1]["data"]["retries"] == failed_id
    assert starts[-1]["data"]["checkpoint_version"] == retried["checkpoint_version"]
    # The retry logs no second output of the call the failed run already logged.
    outputs = [e for e in events if e["event"] == "tool.output"]
    assert [e["run_id"] for e in outputs] == [failed_id]
    ends = [
        (e["run_id"], e["event"]) for e in events if e["event"] in ("run.failed", "run.completed")
    ]
    assert ends == [(failed_id, "run.failed"), (retried["run_id"], "run.completed")]


async def test_a_retry_reports_only_its_own_tokens(gateway_factory: Callable[..., Any]) -> None:
    """The boundary's state carries the failed run's token count; the retry, a run of its own,
    reports only its own calls' tokens, in `run.completed` as in its view."""
    effects = EffectLog()
    graph, _ = scripted_graph(
        "worker",
        [
            ModelStep(output=[call("lookup", "call_1", value="a")], usage=tokens(100, 10)),
            model_down(),
            ModelStep(output=[say("all done")], usage=tokens(200, 20)),
        ],
        effects,
    )
    async with gateway_factory(registry=AgentRegistry([graph])) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice", "user"))
        try:
            first = await alice.request("run.start", input="look it up")
            failed = await alice.wait_event("run.failed")
            retried = await alice.request("run.retry", run_id=first["run_id"])
            completed = await alice.wait_event("run.completed", final_output="all done")
        finally:
            await alice.close()
        async with gw.http() as http:
            auth = {"authorization": f"Bearer {gw.token('alice', 'user')}"}
            views = {
                run_id: (await http.get(f"/v1/runs/{run_id}", headers=auth)).json()["run"]
                for run_id in (first["run_id"], retried["run_id"])
            }
    assert failed["data"]["usage"]["total_tokens"] == 110
    own = completed["data"]["usage"]
    assert (own["requests"], own["input_tokens"], own["total_tokens"]) == (1, 200, 220)
    assert views[first["run_id"]]["usage"]["total_tokens"] == 110
    assert views[retried["run_id"]]["usage"]["total_tokens"] == 220


async def test_an_approved_side_effect_is_not_made_again(
    gateway_factory: Callable[..., Any],
) -> None:
    """Approved, the call ran; the model call after it failed. The retry does not ask again
    and does not charge again: it shares the failed run's ledger scope."""
    effects = EffectLog()
    graph, model = scripted_graph(
        "biller",
        [
            ModelStep(output=[call("charge", "call_c", value="5")]),
            model_down(),
            ModelStep(output=[say("charged")]),
        ],
        effects,
    )
    async with gateway_factory(registry=AgentRegistry([graph]), self_approval=True) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice", "user"))
        try:
            first = await alice.request("run.start", input="charge me")
            requested = await alice.wait_event("approval.requested")
            await alice.request(
                "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
            )
            await alice.wait_event("run.failed")
            retried = await alice.request("run.retry", run_id=first["run_id"])
            await alice.wait_event("run.completed", final_output="charged")
            events = alice.events_of(first["thread_id"])
        finally:
            await alice.close()
    assert effects.count("charge") == 1
    assert len(model.calls) == 3
    assert [e["event"] for e in events].count("approval.requested") == 1
    assert item_kinds(model.calls[2].input) == ["user:charge me", "call:call_c", "output:call_c"]
    assert retried["retries"] == first["run_id"]


async def test_a_run_that_failed_at_once_is_retried_from_its_input(
    gateway_factory: Callable[..., Any],
) -> None:
    effects = EffectLog()
    graph, model = scripted_graph(
        "worker", [model_down(), ModelStep(output=[say("hello")])], effects
    )
    async with gateway_factory(registry=AgentRegistry([graph]), metrics=True) as gw:
        alice = {"Authorization": f"Bearer {gw.token('alice', 'user')}"}
        mallory = {"Authorization": f"Bearer {gw.token('mallory', 'user')}"}
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=10) as http:
            started = (await http.post("/v1/runs", json={"input": "hi"}, headers=alice)).json()
            run_path = f"/v1/runs/{started['run_id']}"
            for _ in range(200):
                run = (await http.get(run_path, headers=alice)).json()["run"]
                if run["status"] == "failed":
                    break
            assert run["status"] == "failed"
            refused = await http.post(f"{run_path}/retry", json={}, headers=mallory)
            assert refused.status_code == 403, refused.text
            missing = await http.post("/v1/runs/r_nope/retry", json={}, headers=alice)
            assert missing.status_code == 404, missing.text
            retried = await http.post(f"{run_path}/retry", json={}, headers=alice)
            assert retried.status_code == 200, retried.text
            body = retried.json()
            assert body["retries"] == started["run_id"]
            assert body["checkpoint_version"] is None
            for _ in range(200):
                again = (await http.get(f"/v1/runs/{body['run_id']}", headers=alice)).json()
                if again["run"]["status"] == "completed":
                    break
            assert again["run"]["status"] == "completed"
            # Still failed: a finished run never continues.
            assert (await http.get(run_path, headers=alice)).json()["run"]["status"] == "failed"
            scraped = (await http.get("/metrics")).text
            admin = {"Authorization": f"Bearer {gw.token('root', 'admin')}"}
            trail = await http.get("/v1/audit", params={"action": "run.retried"}, headers=admin)
    [entry] = trail.json()["audit"]
    assert (entry["actor"], entry["target"], entry["outcome"]) == (
        "alice",
        body["run_id"],
        "success",
    )
    assert entry["details"] == {"thread_id": started["thread_id"], "retries": started["run_id"]}
    assert 'gateway_runs_total{agent="worker",state="started"} 2.0' in scraped
    assert 'gateway_runs_total{agent="worker",state="retried"} 1.0' in scraped
    assert 'gateway_runs_total{agent="worker",state="failed"} 1.0' in scraped
    # The history the retry started on is the one the failed run started on.
    assert item_kinds(model.calls[1].input) == item_kinds(model.calls[0].input) == ["user:hi"]


class FailsOnce(AgentHooks[Any]):
    """Fails the run the first time a tool is about to run: after its approval, before it ran."""

    def __init__(self) -> None:
        self.failed = False

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("the payments service is unreachable")


async def test_a_run_that_failed_after_its_decisions_goes_on_from_the_pause(
    gateway_factory: Callable[..., Any],
) -> None:
    """No turn ended after the pause: the retry goes on from the pause's checkpoint with its
    recorded decision applied, so nobody is asked again and the call runs once."""
    effects = EffectLog()
    hooks = FailsOnce()
    model = ScriptedModel(
        [ModelStep(output=[call("charge", "call_c", value="5")]), ModelStep(output=[say("ok")])]
    )

    def build() -> Agent[Any]:
        charge = effect_tool(effects, "charge", needs_approval=True)
        return Agent(name="biller", instructions="t", model=model, tools=[charge], hooks=hooks)

    graph = AgentGraph(name="biller", version="1", build=build)
    async with gateway_factory(registry=AgentRegistry([graph]), self_approval=True) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice", "user"))
        try:
            first = await alice.request("run.start", input="charge me")
            requested = await alice.wait_event("approval.requested")
            await alice.request(
                "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
            )
            await alice.wait_event("run.failed")
            assert effects.count("charge") == 0
            retried = await alice.request("run.retry", run_id=first["run_id"])
            await alice.wait_event("run.completed", final_output="ok")
            events = alice.events_of(first["thread_id"])
        finally:
            await alice.close()
    paused_at = requested["data"]["checkpoint_version"]
    assert retried["checkpoint_version"] == paused_at
    assert effects.count("charge") == 1
    assert [e["event"] for e in events].count("approval.requested") == 1
    assert len(model.calls) == 2
    assert item_kinds(model.calls[1].input) == ["user:charge me", "call:call_c", "output:call_c"]
    outputs = [e for e in events if e["event"] == "tool.output"]
    assert [(e["run_id"], e["data"]["call_id"]) for e in outputs] == [(retried["run_id"], "call_c")]
