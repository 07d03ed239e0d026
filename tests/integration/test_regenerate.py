"""Regenerate and edit (docs/protocol.md §4 `run.regenerate`): a new answer to a thread's last
input, or to an edit of it, in a run that supersedes the last one; the log keeps every answer and
the agent's history follows the branch chosen."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from agents import Agent
from agents.testing import ModelStep, ScriptedModel

from gateway.agents.registry import AgentGraph, AgentRegistry
from tests.support.agents import say
from tests.support.client import Client, ProtocolFailure


def answering(*answers: str) -> tuple[AgentRegistry, ScriptedModel]:
    model = ScriptedModel([ModelStep(output=[say(answer)]) for answer in answers])

    def build() -> Agent[Any]:
        return Agent(name="answerer", instructions="test agent", model=model)

    return AgentRegistry([AgentGraph(name="answerer", version="1", build=build)]), model


def roles_and_texts(model_input: Any) -> list[tuple[str, str]]:
    out = []
    for item in model_input:
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(str(part.get("text", "")) for part in content)
        out.append((str(item.get("role")), str(content)))
    return out


async def test_regenerate_and_edit_over_the_socket(gateway_factory: Callable[..., Any]) -> None:
    registry, model = answering("one", "two", "three", "four")
    async with gateway_factory(registry=registry) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice", "user"))
        try:
            first = await alice.request("run.start", input="hi")
            thread_id = first["thread_id"]
            await alice.wait_event("run.completed", final_output="one")
            second = await alice.request("run.start", thread_id=thread_id, input="more")
            await alice.wait_event("run.completed", final_output="two")
            again = await alice.request("run.regenerate", thread_id=thread_id)
            assert again["supersedes"] == second["run_id"]
            await alice.wait_event("run.completed", final_output="three")
            edited = await alice.request(
                "run.regenerate", thread_id=thread_id, input="much more", run_id=again["run_id"]
            )
            assert edited["supersedes"] == again["run_id"]
            await alice.wait_event("run.completed", final_output="four")
            # Only the last answer can be replaced, and only once its run has finished.
            with pytest.raises(ProtocolFailure) as stale:
                await alice.request("run.regenerate", thread_id=thread_id, run_id=first["run_id"])
            assert stale.value.code == "conflict"
            events = alice.events_of(thread_id)
        finally:
            await alice.close()
    starts = [e for e in events if e["event"] == "run.started"]
    assert [(s["data"]["input"], s["data"].get("supersedes")) for s in starts] == [
        ("hi", None),
        ("more", None),
        ("more", second["run_id"]),
        ("much more", again["run_id"]),
    ]
    # Every answer stays in the log.
    completed = [e["data"]["final_output"] for e in events if e["event"] == "run.completed"]
    assert completed == ["one", "two", "three", "four"]
    # The agent's history is the branch chosen: the first turn, then the edited input only.
    assert roles_and_texts(model.calls[2].input) == [
        ("user", "hi"),
        ("assistant", "one"),
        ("user", "more"),
    ]
    assert roles_and_texts(model.calls[3].input) == [
        ("user", "hi"),
        ("assistant", "one"),
        ("user", "much more"),
    ]


async def test_regenerate_over_http_and_its_refusals(gateway_factory: Callable[..., Any]) -> None:
    registry, _ = answering("one", "two")
    async with gateway_factory(registry=registry, metrics=True) as gw:
        alice = {"Authorization": f"Bearer {gw.token('alice', 'user')}"}
        mallory = {"Authorization": f"Bearer {gw.token('mallory', 'user')}"}
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=10) as http:
            started = (await http.post("/v1/runs", json={"input": "hi"}, headers=alice)).json()
            path = f"/v1/threads/{started['thread_id']}/regenerate"
            refused = await http.post(path, json={}, headers=mallory)
            assert refused.status_code == 403, refused.text
            blank = await http.post(path, json={"input": "  "}, headers=alice)
            assert blank.status_code == 400, blank.text
            for _ in range(200):
                run = await http.get(f"/v1/runs/{started['run_id']}", headers=alice)
                if run.json()["run"]["status"] == "completed":
                    break
            answer = await http.post(path, json={}, headers=alice)
            assert answer.status_code == 200, answer.text
            assert answer.json()["supersedes"] == started["run_id"]
            missing = await http.post("/v1/threads/t_nope/regenerate", json={}, headers=alice)
            assert missing.status_code == 404
            scraped = (await http.get("/metrics")).text
            admin = {"Authorization": f"Bearer {gw.token('root', 'admin')}"}
            trail = await http.get("/v1/audit", params={"action": "run.regenerated"}, headers=admin)
    [entry] = trail.json()["audit"]
    assert (entry["actor"], entry["target"]) == ("alice", answer.json()["run_id"])
    assert entry["details"] == {
        "thread_id": started["thread_id"],
        "supersedes": started["run_id"],
    }
    assert 'gateway_runs_total{agent="answerer",state="regenerated"} 1.0' in scraped
    assert 'gateway_runs_total{agent="answerer",state="retried"}' not in scraped
