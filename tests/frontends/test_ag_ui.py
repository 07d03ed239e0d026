"""AG-UI on the gateway (docs/protocol.md §12): the real @ag-ui/client HttpAgent, 1.0.0 and
0.0.59 (CopilotKit's), through the JavaScript client package's GatewayAgent, against a real
gateway; and the refusals, with plain HTTP, that must change nothing."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from agents.testing import ModelStep

from gateway.agents.demo.assistant import refund_text
from gateway.agents.registry import AgentRegistry
from gateway.frontends.ag_ui.events import Dialect, ThreadProjection
from gateway.frontends.ag_ui.http import _frame
from tests.integration.test_cross_process import TOKEN, bus_env, pair
from tests.support.ag_ui_input import resolved, run_input
from tests.support.ag_ui_logs import reasoning_log, refund_log
from tests.support.agents import (
    EffectLog,
    handoff_graph,
    nested_graph,
    refuse,
    say,
    scripted_graph,
)
from tests.support.client import Client
from tests.support.gateway import ROOT, Gateway, GatewayProcess, spawn_gateway
from tests.support.node_scripts import FRONTEND_PACKAGES, node_or_skip, node_script

VERSIONS = ["1.0", "0.0.59"]
REFUND = "refund order 42 for 30 dollars"
STORY = "tell me a story about a lighthouse"
PATH = "/v1/ag-ui/assistant"
EXAMPLE_URL = "https://gateway.example.com/v1/ag-ui/assistant"


def auth(
    gateway: Gateway, user: str = "alice", *roles: str, tenant: str = "acme"
) -> dict[str, str]:
    return {"Authorization": f"Bearer {gateway.token(user, *(roles or ('user',)), tenant=tenant)}"}


async def drive(url: str, token: str, scenario: str, thread_id: str, **extra: Any) -> Any:
    config = {
        "scenario": scenario,
        "url": url,
        "token": token,
        "threadId": thread_id,
        "version": "1.0",
        **extra,
    }
    async with node_script("ag_ui.mjs", config, package="@ag-ui/client") as script:
        return await script.until("done", timeout_s=60)


def frames(body: str) -> list[tuple[int, dict[str, Any]]]:
    """The SSE messages of an AG-UI stream: (id, event)."""
    assert "\r" not in body, "AG-UI streams are LF-framed"
    out = []
    for block in body.split("\n\n"):
        if not block.strip() or block.startswith(":"):
            continue
        lines = block.split("\n")
        assert lines[0].startswith("id: ") and lines[1].startswith("data: "), block
        out.append((int(lines[0][4:]), json.loads(lines[1][6:])))
    return out


async def post_run(
    http: httpx.AsyncClient, headers: dict[str, str], body: dict[str, Any]
) -> list[tuple[int, dict[str, Any]]]:
    response = await http.post(PATH, json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return frames(response.text)


async def pause(http: httpx.AsyncClient, headers: dict[str, str], thread_id: str) -> dict[str, Any]:
    """A refund run on a new conversation, paused: its interrupt outcome."""
    received = await post_run(http, headers, run_input(thread_id, "run-1", REFUND))
    finished = received[-1][1]
    assert finished["type"] == "RUN_FINISHED" and finished["outcome"]["type"] == "interrupt"
    return finished


async def thread_state(gateway: Gateway, thread_id: str) -> tuple[int, list[str]]:
    """The thread's newest seq and its runs' statuses, to show a refusal changed nothing."""
    async with gateway.http() as http:
        headers = auth(gateway)
        events = (await http.get(f"/v1/threads/{thread_id}/events", headers=headers)).json()
        run_ids = sorted({e["run_id"] for e in events["events"] if e["run_id"]})
        statuses = [
            (await http.get(f"/v1/runs/{r}", headers=headers)).json()["run"]["status"]
            for r in run_ids
        ]
    return events["head_seq"], statuses


# -- the real clients ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_run_streams_its_text_to_http_agent(gateway: Gateway, version: str) -> None:
    done = await drive(
        f"{gateway.http_url}{PATH}",
        gateway.token("alice", "user"),
        "text",
        f"text-{version}",
        version=version,
        input="hello there",
        runId="client-run-1",
    )
    assert done.get("error") is None, done
    assert [(m["role"], m["content"]) for m in done["messages"]] == [
        ("user", "hello there"),
        ("assistant", 'You said: "hello there"'),
    ]
    assert done["switched"].get("error") is None, done["switched"]
    twin = done["twin"]
    assert twin.get("error") is None and twin["cursor"] == done["lastEventId"]
    assert int(twin["after"]) > int(twin["cursor"]) and done["runnerAfter"] == done["lastEventId"]
    assert [m["content"] for m in twin["messages"]][-1] == 'You said: "and again"'
    assert done["types"][:3] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "STEP_STARTED"]
    assert done["types"][-2:] == ["STEP_FINISHED", "RUN_FINISHED"]
    # The run the client asked for, under the runId it chose, with its model calls' tokens.
    [finished] = done["finished"]
    assert finished == {
        "type": "RUN_FINISHED",
        "timestamp": finished["timestamp"],
        "threadId": f"text-{version}",
        "runId": "client-run-1",
        "usage": finished["usage"],
    }
    [usage] = finished["usage"]
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"] > 0


@pytest.mark.parametrize("version", VERSIONS)
async def test_an_interrupt_is_answered_with_build_resume_array(
    gateway_factory: Callable[..., Any], version: str
) -> None:
    async with gateway_factory(self_approval=True) as gateway:
        config = {
            "scenario": "interrupt",
            "url": f"{gateway.http_url}{PATH}",
            "token": gateway.token("alice", "user"),
            "threadId": f"approve-{version}",
            "version": version,
            "input": REFUND,
            "resumeRunId": "client-run-2",
        }
        async with node_script("ag_ui.mjs", config, package="@ag-ui/client") as script:
            done = await script.until("resumed", timeout_s=60)
            after = await script.until("done", timeout_s=60)
        async with gateway.http() as http:
            approvals = (
                await http.get("/v1/approvals", headers=auth(gateway, "bob", "reviewer"))
            ).json()
    assert done.get("error") is None, done
    [entry] = done["resume"]
    assert entry["status"] == "resolved" and entry["payload"] == {"approved": True}
    assert approvals["approvals"] == []  # decided
    assert done["pendingInterrupts"] == []
    messages = done["messages"]
    call = messages[1]["toolCalls"][0]
    assert call["function"]["name"] == "issue_refund"
    assert messages[2] == {
        "id": f"{call['id']}.output",
        "toolCallId": call["id"],
        "role": "tool",
        "content": messages[2]["content"],
    }
    assert messages[2]["content"].startswith("Refund of 30.00 USD issued for order 42")
    assert messages[3]["content"].startswith("Here is what happened:")
    continuation = done["types"][done["types"].index("RUN_STARTED", 1) :]
    assert "TOOL_CALL_RESULT" in continuation and "TOOL_CALL_START" not in continuation
    assert done["finished"][-1]["runId"] == "client-run-2"
    # The next turn: the snapshot that opens it (with the tool's output) is accepted too.
    assert after.get("error") is None, after
    assert [m["role"] for m in after["messages"]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    assert after["messages"][:4] == messages


async def test_the_interrupt_carries_the_approval(gateway_factory: Callable[..., Any]) -> None:
    async with gateway_factory(approval_ttl_s=600) as gateway, gateway.http() as http:
        finished = await pause(http, auth(gateway), "interrupt-shape")
        [interrupt] = finished["outcome"]["interrupts"]
        events = (
            await http.get("/v1/threads/interrupt-shape/events", headers=auth(gateway))
        ).json()
        run_id = events["events"][0]["run_id"]
        run = (await http.get(f"/v1/runs/{run_id}", headers=auth(gateway))).json()["run"]
    [approval] = run["pending_approvals"]
    assert interrupt["id"] == approval["approval_id"]
    assert interrupt["reason"] == "tool_call"
    assert interrupt["toolCallId"] == approval["call_id"]
    assert interrupt["expiresAt"] == approval["expires_at"]
    assert "issue_refund" in interrupt["message"]
    schema = interrupt["responseSchema"]
    # The demo's refunds take edited arguments (docs/protocol.md §4): editedArgs is offered.
    assert set(schema["properties"]) == {"approved", "reason", "editedArgs"}
    assert schema["required"] == ["approved"]


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_dropped_stream_resumes_with_the_messages_of_an_undisturbed_client(
    gateway_factory: Callable[..., Any], version: str
) -> None:
    async with gateway_factory(demo_delay_ms=4) as gateway:
        done = await drive(
            f"{gateway.http_url}{PATH}",
            gateway.token("alice", "user"),
            "drop",
            f"drop-{version}",
            version=version,
            input=STORY,
            dropAfter=20,
        )
    resumed, watcher, latecomer = done["resumed"], done["watcher"], done["latecomer"]
    for client in (resumed, watcher, latecomer):
        assert client.get("error") is None, client
    story = watcher["messages"][-1]["content"]
    assert len(story.split()) > 200
    # Byte for byte, as each client holds them.
    assert json.dumps(resumed["messages"]) == json.dumps(watcher["messages"])
    assert json.dumps(latecomer["messages"]) == json.dumps(watcher["messages"])
    assert resumed["lastEventId"] == watcher["lastEventId"] == latecomer["lastEventId"]


@pytest.mark.parametrize("version", VERSIONS)
async def test_stop_cancels_the_run_and_each_client_gets_an_ending_it_accepts(
    gateway_factory: Callable[..., Any], version: str
) -> None:
    async with gateway_factory(demo_delay_ms=5) as gateway:
        done = await drive(
            f"{gateway.http_url}{PATH}",
            gateway.token("alice", "user"),
            "stop",
            f"stop-{version}",
            version=version,
            input=STORY,
        )
        head, statuses = await thread_state(gateway, f"stop-{version}")
    assert done.get("error") is None, done
    assert done["stopped"] is True
    assert int(done["lastEventId"]) == head  # the stop's answer did not disturb the cursor
    assert statuses == ["cancelled"]
    [ending] = done["finished"]
    if version == "1.0":
        assert ending["type"] == "RUN_FINISHED" and ending["outcome"] == {"type": "cancelled"}
    else:
        # 0.0.59 fails on a cancelled outcome.
        assert ending["type"] == "RUN_ERROR" and ending["code"] == "cancelled"
    # The stopped message is closed and stays as it was streamed, as the gateway keeps it.
    assert [m["role"] for m in done["messages"]] == ["user", "assistant"]
    assert 0 < len(done["messages"][1]["content"].split()) < 200


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_refusal_reaches_the_client(
    gateway_factory: Callable[..., Any], version: str
) -> None:
    """A refusal streams no text deltas: its text is only in `message.completed`."""
    refusal = "I can't help with that request."
    graph, _ = scripted_graph(
        "refuser",
        [ModelStep(output=[refuse(refusal)]), ModelStep(output=[say("Something else, then.")])],
        EffectLog(),
    )
    path = f"/v1/ag-ui/{graph.name}"
    thread_id = f"refused-{version}"
    async with (
        gateway_factory(registry=AgentRegistry([graph])) as gateway,
        gateway.http() as http,
    ):
        headers = auth(gateway)
        response = await http.post(
            path, json=run_input(thread_id, "run-1", "do something bad"), headers=headers
        )
        received = [event for _, event in frames(response.text)]
        replayed = await drive(
            f"{gateway.http_url}{path}",
            gateway.token("alice", "user"),
            "connect",
            thread_id,
            version=version,
        )
        response = await http.post(
            path, json=run_input(thread_id, "run-2", "what else?"), headers=headers
        )
        snapshot = next(e for _, e in frames(response.text) if e["type"] == "MESSAGES_SNAPSHOT")
    types = [e["type"] for e in received]
    at = types.index("TEXT_MESSAGE_END")
    assert types[at - 1] == "TEXT_MESSAGE_CONTENT" and received[at - 1]["delta"] == refusal
    # A client replaying the thread holds it, and so does the next run's snapshot.
    assert replayed.get("error") is None, replayed
    assert [m.get("content") for m in replayed["messages"]] == ["do something bad", refusal]
    assert [m.get("content") for m in snapshot["messages"]] == [
        "do something bad",
        refusal,
        "what else?",
    ]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("reload", [False, True], ids=["same-agent", "reloaded"])
async def test_a_run_stopped_while_it_waits_for_a_decision_leaves_no_interrupt_behind(
    gateway_factory: Callable[..., Any], version: str, reload: bool
) -> None:
    """The agent that holds the interrupts cancels them; a fresh one replays the thread.
    Either way the interrupts are gone and a new message is answered."""
    thread_id = f"stopped-paused-{version}-{reload}"
    async with gateway_factory(self_approval=True) as gateway:
        config = {
            "scenario": "cancelWhilePaused",
            "url": f"{gateway.http_url}{PATH}",
            "token": gateway.token("alice", "user"),
            "threadId": thread_id,
            "version": version,
            "input": REFUND,
            "reload": reload,
            "next": "hello again",
        }
        async with node_script("ag_ui.mjs", config, package="@ag-ui/client") as script:
            interrupted = await script.until("interrupted", timeout_s=60)
            cleared = await script.until("cleared", timeout_s=60)
            done = await script.until("done", timeout_s=60)
        _, statuses = await thread_state(gateway, thread_id)
    assert len(interrupted["pendingInterrupts"]) == 1
    assert cleared["stopped"] is True
    assert cleared.get("error") is None, cleared
    if not reload:
        assert "not addressed by resume" in cleared["refused"]["error"]
    assert cleared["pendingInterrupts"] == []
    ending = cleared["finished"][-1]
    if version == "1.0":
        assert ending["type"] == "RUN_FINISHED" and ending["outcome"] == {"type": "cancelled"}
    else:
        assert ending["type"] == "RUN_FINISHED" and "outcome" not in ending
    assert done.get("error") is None, done
    assert [m["content"] for m in done["messages"] if m["role"] == "user"][-1] == "hello again"
    assert done["messages"][-1]["content"] == 'You said: "hello again"'
    assert sorted(statuses) == ["cancelled", "completed"]


async def finished_run(http: httpx.AsyncClient, headers: dict[str, str], run_id: str) -> str:
    for _ in range(200):
        run = (await http.get(f"/v1/runs/{run_id}", headers=headers)).json()["run"]
        if run["status"] in ("completed", "failed", "cancelled"):
            return str(run["status"])
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} did not finish")


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_regenerate_and_a_retry_leave_the_conversation_the_agent_sees(
    gateway: Gateway, version: str
) -> None:
    """A regenerated answer replaces the earlier input and answer; a retry answers the failed
    run's input again, not a second copy of it (docs/protocol.md §4)."""
    regenerated, retried = f"regenerated-{version}", f"retried-{version}"
    async with gateway.http() as http:
        headers = auth(gateway)
        await post_run(http, headers, run_input(regenerated, "run-1", "hello"))
        again = await http.post(
            f"/v1/threads/{regenerated}/regenerate", json={"input": "bye"}, headers=headers
        )
        assert again.status_code == 200, again.text
        assert await finished_run(http, headers, again.json()["run_id"]) == "completed"
        failed = await post_run(http, headers, run_input(retried, "run-1", "flaky order 7"))
        assert failed[-1][1]["type"] == "RUN_ERROR"
        log = (await http.get(f"/v1/threads/{retried}/events", headers=headers)).json()
        retry = await http.post(f"/v1/runs/{log['events'][0]['run_id']}/retry", headers=headers)
        assert retry.status_code == 200, retry.text
        assert retry.json()["checkpoint_version"] is not None  # from the failed run's boundary
        assert await finished_run(http, headers, retry.json()["run_id"]) == "completed"
        following = await post_run(http, headers, run_input(regenerated, "run-3", "and?"))
    snapshot = next(e for _, e in following if e["type"] == "MESSAGES_SNAPSHOT")
    assert [(m["role"], m["content"]) for m in snapshot["messages"]] == [
        ("user", "bye"),
        ("assistant", 'You said: "bye"'),
        ("user", "and?"),
    ]
    # A client that replays either conversation holds what the agent sees.
    token = gateway.token("alice", "user")
    url = f"{gateway.http_url}{PATH}"
    replayed = await drive(url, token, "connect", regenerated, version=version)
    assert [m["content"] for m in replayed["messages"]] == [
        "bye",
        'You said: "bye"',
        "and?",
        'You said: "and?"',
    ]
    replayed = await drive(url, token, "connect", retried, version=version)
    assert replayed.get("error") is None, replayed
    messages = replayed["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[0]["content"] == "flaky order 7"
    assert messages[1]["toolCalls"][0]["id"] == messages[2]["toolCallId"]


async def test_a_reviewer_deciding_elsewhere_shows_on_the_next_connect(gateway: Gateway) -> None:
    config = {
        "scenario": "decidedElsewhere",
        "url": f"{gateway.http_url}{PATH}",
        "token": gateway.token("alice", "user"),
        "threadId": "elsewhere",
        "version": "1.0",
        "input": REFUND,
    }
    async with node_script("ag_ui.mjs", config, package="@ag-ui/client") as script:
        interrupted = await script.until("interrupted", timeout_s=60)
        [interrupt] = interrupted["pendingInterrupts"]
        async with gateway.http() as http:
            decided = await http.post(
                f"/v1/approvals/{interrupt['id']}/decision",
                json={"decision": "reject", "reason": "not this one"},
                headers=auth(gateway, "bob", "reviewer"),
            )
        assert decided.status_code == 200, decided.text
        script.tell({"decided": True})
        done = await script.until("done", timeout_s=60)
    assert done.get("error") is None, done
    assert done["pendingInterrupts"] == []
    assert [m["role"] for m in done["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert done["messages"][2]["content"] == "not this one"


async def test_connect_with_nothing_to_send_is_an_empty_200(gateway: Gateway) -> None:
    async with gateway.http() as http:
        headers = auth(gateway)
        await post_run(http, headers, run_input("quiet", "run-1", "hello"))
        head, _ = await thread_state(gateway, "quiet")
        at_head = await http.post(
            f"{PATH}/connect",
            json=run_input("quiet", "c-1"),
            headers={**headers, "Last-Event-ID": str(head)},
        )
        unknown = await http.post(
            f"{PATH}/connect", json=run_input("never-ran", "c-2"), headers=headers
        )
        past = await http.post(
            f"{PATH}/connect",
            json=run_input("quiet", "c-3", forwardedProps={"lastEventId": head + 5}),
            headers=headers,
        )
    assert (at_head.status_code, at_head.text) == (200, "")
    assert (unknown.status_code, unknown.text) == (200, "")
    assert past.status_code == 400 and "past the thread's newest event" in past.text
    done = await drive(
        f"{gateway.http_url}{PATH}",
        gateway.token("alice", "user"),
        "connect",
        "quiet",
        lastEventId=head,
    )
    assert done.get("error") is None and done["types"] == [], done


# -- interrupts over plain HTTP -------------------------------------------------------------------


async def test_an_approval_with_edited_args_runs_the_call_with_them(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(self_approval=True) as gateway, gateway.http() as http:
        headers = auth(gateway)
        finished = await pause(http, headers, "edited")
        [interrupt] = finished["outcome"]["interrupts"]
        edited = {"order_id": 42, "amount": 12.5}
        resume = [resolved(interrupt["id"], approved=True, editedArgs=edited)]
        received = await post_run(http, headers, run_input("edited", "run-2", resume=resume))
        run = (await http.get("/v1/threads/edited/events", headers=headers)).json()
    [result] = [e for _, e in received if e["type"] == "TOOL_CALL_RESULT"]
    assert refund_text(42, 12.5) in result["content"]
    assert result["content"].startswith("[A reviewer approved this call with changed arguments")
    [decided] = [e["data"] for e in run["events"] if e["event"] == "approval.decided"]
    assert decided["edited_arguments"] == edited


async def test_an_uncovered_or_forged_resume_is_refused_and_changes_nothing(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(self_approval=True) as gateway, gateway.http() as http:
        headers = auth(gateway)
        finished = await pause(http, headers, "refusals")
        [interrupt] = finished["outcome"]["interrupts"]
        before = await thread_state(gateway, "refusals")

        def resuming(*answers: dict[str, Any]) -> dict[str, Any]:
            return run_input("refusals", "run-2", resume=list(answers))

        real = interrupt["id"]
        attempts = {
            "uncovered": (resuming(), 400),
            "forged": (resuming(resolved("ap_forged", approved=True)), 404),
            "forged beside a real one": (
                resuming(
                    resolved(real, approved=True),
                    resolved("ap_0123456789abcdef01234567", approved=True),
                ),
                404,
            ),
            "edited arguments the tool's schema refuses": (
                resuming(resolved(real, approved=True, editedArgs={"amount": 3000})),
                400,
            ),
            "edited arguments with a rejection": (
                resuming(resolved(real, approved=False, editedArgs={"order_id": 42})),
                400,
            ),
            "no approved": (resuming(resolved(real)), 400),
            "a new message instead": (run_input("refusals", "run-2", "and another thing"), 409),
        }
        for name, (body, status) in attempts.items():
            response = await http.post(PATH, json=body, headers=headers)
            assert response.status_code == status, (name, response.text)
            assert response.json()["error"]["message"], name
        assert await thread_state(gateway, "refusals") == before
        # Someone else's decision, even with the same id, is not the caller's to make.
        other = await http.post(
            PATH,
            json=resuming(resolved(real, approved=True)),
            headers=auth(gateway, "mallory"),
        )
        assert other.status_code == 403, other.text
        assert await thread_state(gateway, "refusals") == before


async def test_a_replayed_resume_streams_the_continuation_again(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(self_approval=True) as gateway, gateway.http() as http:
        headers = auth(gateway)
        finished = await pause(http, headers, "replayed")
        [interrupt] = finished["outcome"]["interrupts"]
        resume = [resolved(interrupt["id"], approved=True)]
        first = await post_run(http, headers, run_input("replayed", "run-2", resume=resume))
        again = await post_run(http, headers, run_input("replayed", "run-2", resume=resume))
        after = await thread_state(gateway, "replayed")
        otherwise = await http.post(
            PATH,
            json=run_input(
                "replayed",
                "run-3",
                resume=[resolved(interrupt["id"], approved=False)],
            ),
            headers=headers,
        )
    assert [e for _, e in first] == [e for _, e in again]
    assert [s for s, _ in first] == [s for s, _ in again]
    assert after[1] == ["completed"]
    assert sum(e["type"] == "TOOL_CALL_RESULT" for _, e in first) == 1
    assert otherwise.status_code == 409, otherwise.text


async def test_a_resume_sent_again_must_repeat_the_answers(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(self_approval=True) as gateway, gateway.http() as http:
        headers = auth(gateway)
        interrupts = {}
        for thread_id in ("edits-approved", "edits-rejected"):
            [interrupts[thread_id]] = (await pause(http, headers, thread_id))["outcome"][
                "interrupts"
            ]

        def resuming(thread_id: str, **payload: Any) -> dict[str, Any]:
            answer = resolved(interrupts[thread_id]["id"], **payload)
            return run_input(thread_id, "run-2", resume=[answer])

        edited = {"order_id": 42, "amount": 12.5}
        given = {
            "edits-approved": resuming("edits-approved", approved=True, editedArgs=edited),
            "edits-rejected": resuming("edits-rejected", approved=False, reason="not today"),
        }
        for body in given.values():
            await post_run(http, headers, body)
        before = {t: await thread_state(gateway, t) for t in given}
        attempts = {
            "other edited arguments": (
                resuming("edits-approved", approved=True, editedArgs={"order_id": 42, "amount": 1}),
                409,
            ),
            "no edited arguments": (resuming("edits-approved", approved=True), 409),
            "a reason besides": (
                resuming("edits-approved", approved=True, editedArgs=edited, reason="ok"),
                409,
            ),
            "edited arguments the tool's schema refuses": (
                resuming("edits-approved", approved=True, editedArgs={"amount": "lots"}),
                400,
            ),
            "another reason": (resuming("edits-rejected", approved=False, reason="never"), 409),
            "no reason": (resuming("edits-rejected", approved=False), 409),
            "cancelled instead": (
                run_input(
                    "edits-rejected",
                    "run-2",
                    resume=[
                        {"interruptId": interrupts["edits-rejected"]["id"], "status": "cancelled"}
                    ],
                ),
                409,
            ),
        }
        for name, (body, status) in attempts.items():
            response = await http.post(PATH, json=body, headers=headers)
            assert response.status_code == status, (name, response.text)
            assert response.json()["error"]["message"], name
        assert {t: await thread_state(gateway, t) for t in given} == before
        # The same answers again: the continuation, streamed again.
        for body in given.values():
            again = await post_run(http, headers, body)
            assert again[-1][1]["type"] == "RUN_FINISHED"


async def test_copilotkit_habits_a_reused_run_id_and_a_synthetic_tool_message(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(self_approval=True) as gateway, gateway.http() as http:
        headers = auth(gateway)
        finished = await pause(http, headers, "copilotkit")
        [interrupt] = finished["outcome"]["interrupts"]
        payload = {"approved": True}
        body = run_input(
            "copilotkit",
            "run-1",  # the interrupted run's own runId, as CopilotKit sends it
            resume=[resolved(interrupt["id"], **payload)],
        )
        body["messages"] = [
            {"id": "u-run-1", "role": "user", "content": REFUND},
            {
                "id": "synthetic-1",
                "role": "tool",
                "toolCallId": interrupt["toolCallId"],
                "content": json.dumps(payload),
            },
        ]
        body.pop("protocolVersion")  # CopilotKit's 0.0.59 sends none
        received = await post_run(http, headers, body)
    events = [e for _, e in received]
    assert events[0] == {**events[0], "type": "RUN_STARTED", "runId": "run-1"}
    snapshot = events[1]["messages"]
    assert all(m["id"] != "synthetic-1" for m in snapshot)
    assert [e["toolCallId"] for e in events if e["type"] == "TOOL_CALL_RESULT"] == [
        interrupt["toolCallId"]
    ]
    assert events[-1]["type"] == "RUN_FINISHED" and "outcome" not in events[-1]


async def test_every_event_carries_the_seq_it_comes_from(gateway: Gateway) -> None:
    async with gateway.http() as http:
        headers = auth(gateway)
        received = await post_run(http, headers, run_input("seqs", "run-1", "hello"))
        log = (await http.get("/v1/threads/seqs/events", headers=headers)).json()["events"]
    ids = [seq for seq, _ in received]
    assert ids == sorted(ids) and ids[0] == 1 and ids[-1] == log[-1]["seq"]
    by_seq = {e["seq"]: e["event"] for e in log}
    for seq, event in received:
        if event["type"] == "TEXT_MESSAGE_CONTENT":
            assert by_seq[seq] == "message.delta"


# -- hostile input --------------------------------------------------------------------------------


async def test_hostile_input_gets_a_clear_error_and_changes_nothing(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(frontend_body_bytes=65536, max_input_chars=1000) as gateway:
        async with gateway.http() as http:
            headers = auth(gateway)
            await post_run(http, headers, run_input("mine", "run-1", "hello"))
            before = await thread_state(gateway, "mine")
            huge = run_input("new-1", "run-1", "x")
            huge["messages"] = [
                {"id": f"m{i}", "role": "assistant", "content": "y" * 1000} for i in range(80)
            ] + huge["messages"]
            cases: list[tuple[str, dict[str, Any], Any, int]] = [
                ("not JSON", {"content-type": "application/json"}, b"{nope", 400),
                ("not an object", {}, [1, 2], 400),
                ("no threadId", {}, {"runId": "r", "messages": []}, 400),
                ("messages not a list", {}, {**run_input("new-1", "r"), "messages": "hi"}, 400),
                (
                    "a bad role",
                    {},
                    {
                        **run_input("new-1", "r"),
                        "messages": [{"id": "1", "role": "boss", "content": "x"}],
                    },
                    400,
                ),
                ("a bad threadId", {}, run_input("../etc/passwd", "r", "hi"), 400),
                ("a too long threadId", {}, run_input("t" * 65, "r", "hi"), 400),
                ("no user message", {}, run_input("new-1", "r"), 400),
                ("an empty message", {}, run_input("new-1", "r", "   "), 400),
                ("a too long message", {}, run_input("new-1", "r", "z" * 1001), 413),
                ("a huge body", {}, huge, 413),
                ("a resume on a new thread", {}, run_input("new-1", "r", resume=[]), 409),
                ("no bearer token", {"Authorization": ""}, run_input("new-1", "r", "hi"), 401),
            ]
            for name, extra_headers, body, status in cases:
                if isinstance(body, bytes):
                    response = await http.post(
                        PATH, content=body, headers={**headers, **extra_headers}
                    )
                else:
                    response = await http.post(
                        PATH, json=body, headers={**headers, **extra_headers}
                    )
                assert response.status_code == status, (name, response.text)
                assert response.json()["error"]["message"], name
            wrong_type = await http.post(
                PATH, content=b"{}", headers={**headers, "content-type": "text/plain"}
            )
            assert wrong_type.status_code == 415
            unknown_agent = await http.post(
                "/v1/ag-ui/nobody", json=run_input("new-1", "r", "hi"), headers=headers
            )
            assert unknown_agent.status_code == 404
            # Another tenant's conversation does not exist for the caller; another user's is
            # refused; neither is touched.
            elsewhere = await http.post(
                PATH,
                json=run_input("mine", "run-2", "hi"),
                headers=auth(gateway, "eve", tenant="evil"),
            )
            assert elsewhere.status_code == 404, elsewhere.text
            neighbour = await http.post(
                PATH, json=run_input("mine", "run-2", "hi"), headers=auth(gateway, "mallory")
            )
            assert neighbour.status_code == 403, neighbour.text
            for path in (f"{PATH}/connect", f"{PATH}/stop/mine"):
                response = await http.post(
                    path, json=run_input("mine", "c"), headers=auth(gateway, "eve", tenant="evil")
                )
                assert response.status_code == 404, (path, response.text)
            threads = (await http.get("/v1/threads", headers=headers)).json()["threads"]
        assert [t["thread_id"] for t in threads] == ["mine"]
        assert await thread_state(gateway, "mine") == before


# -- several processes ----------------------------------------------------------------------------


@pytest.mark.both_backends
@pytest.mark.needs_service("redis")
async def test_a_drop_on_one_process_resumes_on_another(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    a, b = pair(tmp_path, database_url, processes, **bus_env("redis"))
    done = await drive(
        f"http://127.0.0.1:{a.port}{PATH}",
        TOKEN.issue("alice", "acme", ["user"]),
        "drop",
        "across",
        input=STORY,
        dropAfter=20,
        watchUrl=f"http://127.0.0.1:{b.port}{PATH}",
        resumeUrl=f"http://127.0.0.1:{b.port}{PATH}",
    )
    resumed, watcher, latecomer = done["resumed"], done["watcher"], done["latecomer"]
    for client in (resumed, watcher, latecomer):
        assert client.get("error") is None, client
    assert len(watcher["messages"][-1]["content"].split()) > 200
    assert json.dumps(resumed["messages"]) == json.dumps(watcher["messages"])
    assert json.dumps(latecomer["messages"]) == json.dumps(watcher["messages"])


# -- CopilotKit -----------------------------------------------------------------------------------


async def test_copilotkit_runs_on_the_gateway_as_its_runtime(
    gateway_factory: Callable[..., Any],
) -> None:
    config = {
        "runtimeUrl": "",
        "token": "",
        "threadId": "ck-refund",
        "storyThreadId": "ck-story",
        "singleThreadId": "ck-single",
        "input": REFUND,
        "story": STORY,
    }
    async with gateway_factory(self_approval=True, demo_delay_ms=5) as gateway:
        config |= {
            "runtimeUrl": f"{gateway.http_url}/v1/copilotkit",
            "token": gateway.token("alice"),
        }
        async with node_script("copilotkit.mjs", config, package="@copilotkit/core") as script:
            info = await script.until("info", timeout_s=60)
            interrupted = await script.until("interrupted", timeout_s=60)
            resumed = await script.until("resumed", timeout_s=60)
            connected = await script.until("connected", timeout_s=60)
            stopped = await script.until("stopped", timeout_s=60)
            done = await script.until("done", timeout_s=60)
        _, statuses = await thread_state(gateway, "ck-story")
    assert info["info"]["mode"] == "sse" and set(info["info"]["agents"]) == {"assistant"}
    [interrupt] = interrupted["pendingInterrupts"]
    assert interrupt["reason"] == "tool_call"
    # The resume went out under the interrupted run's runId, with a synthetic tool message;
    # the gateway's snapshot replaced that message with the call's real output.
    assert resumed["finished"][-1]["runId"] == resumed["runId"]
    assert [m["role"] for m in resumed["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert resumed["messages"][2]["id"] == f"{interrupt['toolCallId']}.output"
    assert resumed["pendingInterrupts"] == []
    # After a thread switch, a connect restores the same conversation.
    assert json.dumps(connected["messages"]) == json.dumps(resumed["messages"])
    # abortRun() stops the run on the gateway; 0.0.59 gets an ending it accepts.
    assert statuses == ["cancelled"]
    assert stopped["story"]["finished"][-1]["code"] == "cancelled"
    # The single-route transport: a run, and a connect that restores it.
    assert [m["content"] for m in done["single"]["messages"]] == [
        "hello there",
        'You said: "hello there"',
    ]
    assert json.dumps(done["rejoined"]["messages"]) == json.dumps(done["single"]["messages"])


async def test_copilotkit_goes_on_after_a_run_stopped_while_it_waits_for_a_decision(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(self_approval=True) as gateway:
        config = {
            "scenario": "cancelWhilePaused",
            "runtimeUrl": f"{gateway.http_url}/v1/copilotkit",
            "token": gateway.token("alice"),
            "threadId": "ck-stopped-paused",
            "input": REFUND,
        }
        async with node_script("copilotkit.mjs", config, package="@copilotkit/core") as script:
            done = await script.until("done", timeout_s=90)
    for path in ("same", "reload"):
        result = done[path]
        assert result["held"] == 1 and result["stopped"] == {"stopped": True}, result
        assert result["cleared"]["pendingInterrupts"] == [], result
        after = result["after"]
        assert after["error"] is None, after
        assert after["messages"][-1]["content"] == 'You said: "hello again"'


async def test_a_connect_after_the_gateway_restarts_is_exact(
    tmp_path: Path, processes: list[GatewayProcess]
) -> None:
    env = {"GATEWAY_DEMO_DELAY_MS": "5"}
    first = spawn_gateway(tmp_path, env=env)
    processes.append(first)
    config = {
        "scenario": "restart",
        "url": f"http://127.0.0.1:{first.port}{PATH}",
        "token": TOKEN.issue("alice", "acme", ["user"]),
        "threadId": "restarted",
        "version": "1.0",
        "input": STORY,
        "dropAfter": 20,
    }
    async with node_script("ag_ui.mjs", config, package="@ag-ui/client") as script:
        await script.until("midway", timeout_s=60)
        first.kill()  # SIGKILL: nothing of the run is finished or checkpointed on the way out
        cut = await script.until("cut", timeout_s=60)
        # The same instance id: the new process takes the run over at once.
        second = spawn_gateway(tmp_path, env=env)
        processes.append(second)
        script.tell({"url": f"http://127.0.0.1:{second.port}{PATH}"})
        done = await script.until("done", timeout_s=90)
    resumed, latecomer = done["resumed"], done["latecomer"]
    assert int(cut["lastEventId"]) > 0
    for client in (resumed, latecomer):
        assert client.get("error") is None, client
    assert json.dumps(resumed["messages"]) == json.dumps(latecomer["messages"])
    # The message the crash cut is gone; the recovered run told the story whole.
    roles = [m["role"] for m in resumed["messages"]]
    assert roles == ["user", "assistant"]
    assert len(resumed["messages"][-1]["content"].split()) > 200


async def test_a_resume_of_an_expired_interrupt_is_refused_and_records_the_expiry(
    gateway_factory: Callable[..., Any],
) -> None:
    # Expired before the sweep has rejected it: the decision itself must be refused, and the
    # expiry it found is recorded at once, as the sweep would record it.
    async with (
        gateway_factory(self_approval=True, approval_ttl_s=1.0, approval_sweep_s=3600) as gateway,
        gateway.http() as http,
    ):
        headers = auth(gateway)
        finished = await pause(http, headers, "expired")
        [interrupt] = finished["outcome"]["interrupts"]
        assert "expiresAt" in interrupt
        await asyncio.sleep(1.2)
        for _ in range(2):
            response = await http.post(
                PATH,
                json=run_input(
                    "expired", "run-2", resume=[resolved(interrupt["id"], approved=True)]
                ),
                headers=headers,
            )
            assert response.status_code == 409, response.text
            assert "expired" in response.json()["error"]["message"]
        log = (await http.get("/v1/threads/expired/events", headers=headers)).json()["events"]
    decided = [e["data"] for e in log if e["event"] == "approval.decided"]
    assert [(d["approval_id"], d["decision"], d.get("expired")) for d in decided] == [
        (interrupt["id"], "reject", True)
    ]


async def test_an_expired_interrupt_is_cancelled_and_the_conversation_goes_on(
    gateway_factory: Callable[..., Any],
) -> None:
    """`@ag-ui/client` answers an expired interrupt only with `cancelled`: that answer, before
    the sweep has run, is taken at once, and the next message after it."""
    async with gateway_factory(
        self_approval=True, approval_ttl_s=1.0, approval_sweep_s=3600
    ) as gateway:
        config = {
            "scenario": "expired",
            "url": f"{gateway.http_url}{PATH}",
            "token": gateway.token("alice", "user"),
            "threadId": "expired-cancelled",
            "version": "1.0",
            "input": REFUND,
        }
        async with node_script("ag_ui.mjs", config, package="@ag-ui/client") as script:
            await script.until("interrupted", timeout_s=60)
            await asyncio.sleep(1.2)
            script.tell({"expired": True})
            cancelled = await script.until("cancelled", timeout_s=60)
            done = await script.until("done", timeout_s=60)
    assert cancelled["expired"] is True
    assert "Cancel it to continue" in cancelled["approved"]["error"]
    assert cancelled.get("error") is None, cancelled
    assert cancelled["pendingInterrupts"] == []
    [result] = [m for m in cancelled["messages"] if m["role"] == "tool"]
    assert result["content"] == "The approval request expired after 1 second without a decision."
    assert done.get("error") is None, done
    assert [m["role"] for m in done["messages"]][-2:] == ["user", "assistant"]
    assert done["messages"][-1]["content"]


def test_the_gateway_agent_declarations_compile_against_ag_ui_client(tmp_path: Path) -> None:
    """client_demo/js/types/ag-ui.d.ts against the real @ag-ui/client 1.0.0 declarations, as an
    app written in TypeScript uses them."""
    node = node_or_skip("@ag-ui/client")
    tsc = ROOT / "client_demo" / "js" / "node_modules" / "typescript" / "bin" / "tsc"
    if not tsc.exists():
        pytest.skip("typescript is not installed: run `npm ci` in client_demo/js")
    (tmp_path / "usage.ts").write_text(
        """import { buildResumeArray } from "@ag-ui/client";
import * as agui from "@ag-ui/client";
import { GatewayAgent, makeGatewayAgent } from "agents-ws-gateway-client/ag-ui";

const agent = new GatewayAgent({ url: "http://gw/v1/ag-ui/a", threadId: "t", lastEventId: 5 });
export const cursor: string | null = agent.lastEventId;
export async function go(): Promise<boolean> {
  await agent.runAgent({ resume: buildResumeArray(agent.pendingInterrupts, {}) });
  await agent.connectAgent();
  return agent.stopRun();
}
const Made = makeGatewayAgent(agui);
export const made: GatewayAgent = new Made({ url: agent.connectUrl });
"""
    )
    client = FRONTEND_PACKAGES / "node_modules" / "@ag-ui" / "client" / "dist" / "index.d.mts"
    options = {
        "strict": True,
        "noEmit": True,
        "target": "ES2022",
        "module": "NodeNext",
        "moduleResolution": "NodeNext",
        "lib": ["ES2022", "DOM"],
        "types": [],
        "skipLibCheck": True,
        "baseUrl": ".",
        "paths": {
            "@ag-ui/client": [str(client)],
            "agents-ws-gateway-client/ag-ui": [
                str(ROOT / "client_demo" / "js" / "types" / "ag-ui.d.ts")
            ],
        },
    }
    (tmp_path / "tsconfig.json").write_text(
        json.dumps({"compilerOptions": options, "files": ["usage.ts"]})
    )
    result = subprocess.run(
        [node, str(tsc), "-p", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


async def test_the_example_of_docs_frontend_runs(gateway_factory: Callable[..., Any]) -> None:
    """The `@ag-ui/client` example of docs/frontend.md "AG-UI and CopilotKit", as it is on the
    page, against a real gateway (GatewayAgent from the package's source)."""
    node = node_or_skip("@ag-ui/client")
    page = (ROOT / "docs" / "frontend.md").read_text(encoding="utf-8")
    [example] = re.findall(r"```javascript\n(.*?)```", page, flags=re.S)
    package_import = 'import { GatewayAgent } from "agents-ws-gateway-client/ag-ui";\n'
    assert package_import in example and EXAMPLE_URL in example
    source = ROOT / "client_demo" / "js" / "src" / "ag-ui-agent.js"
    async with gateway_factory(self_approval=True) as gateway:
        script = (
            example.replace(
                package_import,
                'import * as agui from "@ag-ui/client";\n'
                f'import {{ makeGatewayAgent }} from "{source.as_posix()}";\n'
                "const GatewayAgent = makeGatewayAgent(agui);\n"
                f"const token = {json.dumps(gateway.token('alice'))};\n",
            ).replace(EXAMPLE_URL, f"{gateway.http_url}{PATH}")
            + "console.log(JSON.stringify(agent.messages));\n"
        )
        path = FRONTEND_PACKAGES / f".docs-example-{uuid.uuid4().hex}.mjs"
        path.write_text(script, encoding="utf-8")
        try:
            process = await asyncio.create_subprocess_exec(
                node,
                str(path),
                cwd=FRONTEND_PACKAGES,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(process.communicate(), 60)
        finally:
            path.unlink()
    assert process.returncode == 0, err.decode()
    messages = json.loads(out.decode().strip().splitlines()[-1])
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[2]["content"].startswith("Refund of 30.00 USD issued for order 42")


@pytest.mark.needs_service("redis")
async def test_a_stop_sent_to_another_process_ends_the_run_where_it_streams(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    a, b = pair(tmp_path, database_url, processes, GATEWAY_DEMO_DELAY_MS="10", **bus_env("redis"))
    headers = {"Authorization": f"Bearer {TOKEN.issue('alice', 'acme', ['user'])}"}
    body = run_input("stopped-elsewhere", "run-1", STORY)
    received: list[dict[str, Any]] = []
    async with (
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{a.port}", timeout=30) as on_a,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{b.port}", timeout=30) as on_b,
        on_a.stream("POST", PATH, json=body, headers=headers) as response,
    ):
        assert response.status_code == 200
        stopped = None
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            received.append(json.loads(line[6:]))
            if received[-1]["type"] == "TEXT_MESSAGE_CONTENT" and stopped is None:
                stopped = await on_b.post(
                    f"{PATH}/stop/stopped-elsewhere", json={"runId": "run-1"}, headers=headers
                )
    assert stopped is not None and stopped.json() == {"stopped": True}, stopped
    assert received[-1] == {
        **received[-1],
        "type": "RUN_FINISHED",
        "outcome": {"type": "cancelled"},
    }
    assert received[-1]["runId"] == "run-1"


async def test_a_new_message_while_a_run_streams_is_refused(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(demo_delay_ms=10) as gateway, gateway.http() as http:
        headers = auth(gateway)
        async with http.stream(
            "POST", PATH, json=run_input("busy", "run-1", STORY), headers=headers
        ) as streaming:
            assert streaming.status_code == 200
            async for line in streaming.aiter_lines():
                if '"TEXT_MESSAGE_CONTENT"' in line:
                    break
            second = await http.post(PATH, json=run_input("busy", "run-2", "hi"), headers=headers)
            assert second.status_code == 409, second.text
            assert "connect" in second.json()["error"]["message"]
            stop = await http.post(f"{PATH}/stop/busy", json={}, headers=headers)
            assert stop.json() == {"stopped": True}


async def test_a_pause_with_two_approvals_needs_both_answered(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(self_approval=True) as gateway, gateway.http() as http:
        headers = auth(gateway)
        received = await post_run(
            http,
            headers,
            run_input("two", "run-1", "refund order 42 for 30 dollars and email bob@example.com"),
        )
        interrupts = received[-1][1]["outcome"]["interrupts"]
        assert sorted(i["metadata"]["agents-gateway"]["toolName"] for i in interrupts) == [
            "issue_refund",
            "send_email",
        ]
        answers = [resolved(i["id"], approved=True) for i in interrupts]
        before = await thread_state(gateway, "two")
        half = await http.post(
            PATH, json=run_input("two", "run-2", resume=answers[:1]), headers=headers
        )
        assert half.status_code == 400 and interrupts[1]["id"] in half.text, half.text
        assert await thread_state(gateway, "two") == before
        # One answered "cancelled": a rejection the model is told about.
        answers[1] = {"interruptId": interrupts[1]["id"], "status": "cancelled"}
        continuation = await post_run(http, headers, run_input("two", "run-2", resume=answers))
    results = {
        e["toolCallId"]: e["content"] for _, e in continuation if e["type"] == "TOOL_CALL_RESULT"
    }
    assert results.keys() == {i["toolCallId"] for i in interrupts}
    assert results[interrupts[1]["toolCallId"]] == "The user cancelled this call."
    assert continuation[-1][1]["type"] == "RUN_FINISHED"


async def connect_until_it_ends(
    http: httpx.AsyncClient, headers: dict[str, str], body: dict[str, Any], cursor: int | None
) -> list[tuple[int, dict[str, Any]]]:
    """A connect's frames, once it has ended by itself (a stream still open after a few
    heartbeats fails the test)."""
    if cursor is not None:
        headers = {**headers, "Last-Event-ID": str(cursor)}
    try:
        response = await http.post(
            f"{PATH}/connect", json=body, headers=headers, timeout=httpx.Timeout(5.0)
        )
    except httpx.ReadTimeout:
        raise AssertionError(f"the connect from {cursor} did not end") from None
    assert response.status_code == 200, response.text
    return frames(response.text)


async def test_a_connect_ends_on_a_quiet_thread_whatever_event_comes_last(
    gateway_factory: Callable[..., Any],
) -> None:
    """A decision made elsewhere after a pause gives no AG-UI event: a connect whose log ends
    with one ends all the same. So does one from inside a run that was suspended."""
    async with (
        gateway_factory(self_approval=True, suspend_grace_s=0.2, demo_delay_ms=15) as gateway,
        gateway.http() as http,
    ):
        headers = auth(gateway)
        paused = await post_run(
            http,
            headers,
            run_input("half", "run-1", "refund order 42 for 30 dollars and email bob@example.com"),
        )
        pause_seq, finished = paused[-1]
        interrupts = finished["outcome"]["interrupts"]
        decided = await http.post(
            f"/v1/approvals/{interrupts[0]['id']}/decision",
            json={"decision": "approve"},
            headers=auth(gateway, "bob", "reviewer"),
        )
        assert decided.status_code == 200, decided.text
        body = run_input("half", "c")
        replayed = await connect_until_it_ends(http, headers, body, None)
        assert [(s, e["type"]) for s, e in replayed] == [(s, e["type"]) for s, e in paused]
        assert await connect_until_it_ends(http, headers, body, pause_seq) == []

        # A run of the native protocol suspended for want of a watcher (docs/protocol.md §6).
        alice = await Client.connect(gateway.ws_url, gateway.token("alice"))
        ack = await alice.request(
            "run.start", input="status of orders 11, 12, 13 and 14", on_disconnect="suspend"
        )
        output = await alice.wait_event("tool.output")
        await alice.close()
        for _ in range(200):
            run = (await http.get(f"/v1/runs/{ack['run_id']}", headers=headers)).json()["run"]
            if run["status"] == "suspended":
                break
            await asyncio.sleep(0.05)
        assert run["status"] == "suspended"
        body = run_input(ack["thread_id"], "c")
        inside = await connect_until_it_ends(http, headers, body, output["seq"])
        assert [e["type"] for _, e in inside][:3] == [
            "RUN_STARTED",
            "MESSAGES_SNAPSHOT",
            "STEP_STARTED",
        ]
        replayed = await connect_until_it_ends(http, headers, body, None)
        assert replayed[0][1]["type"] == "RUN_STARTED"
    # The connect, a watcher, continued the run (docs/protocol.md §6), and ended with it.
    assert inside[-1][1]["type"] == "RUN_FINISHED"


@pytest.mark.parametrize("which", ["handoff", "nested"])
async def test_handoffs_and_agents_as_tools_stream_as_steps_the_client_verifies(
    gateway_factory: Callable[..., Any], which: str
) -> None:
    effects = EffectLog()
    graph = (handoff_graph if which == "handoff" else nested_graph)(effects)[0]
    registry = AgentRegistry([graph], default=graph.name)
    async with gateway_factory(registry=registry, self_approval=True) as gateway:
        config = {
            "scenario": "interrupt",
            "url": f"{gateway.http_url}/v1/ag-ui/{graph.name}",
            "token": gateway.token("alice", "user"),
            "threadId": which,
            "version": "1.0",
            "input": "go",
            "followUp": False,
        }
        async with node_script("ag_ui.mjs", config, package="@ag-ui/client") as script:
            interrupted = await script.until("interrupted", timeout_s=60)
            resumed = await script.until("resumed", timeout_s=60)
    # @ag-ui/client verified every step and construct on the way (a fault fails the run).
    assert resumed.get("error") is None, resumed
    assert effects.count("charge") == 1
    [interrupt] = interrupted["pendingInterrupts"]
    assert interrupt["metadata"]["agents-gateway"]["toolName"] == "charge"
    steps = [t for t in resumed["types"] if t.startswith("STEP_")]
    assert steps.count("STEP_STARTED") == steps.count("STEP_FINISHED")
    final = resumed["messages"][-1]
    assert final["role"] == "assistant"
    assert final["content"] in ("refunds finished", "outer done: billing said OK")
    if which == "handoff":
        assert steps[:3] == ["STEP_STARTED", "STEP_FINISHED", "STEP_STARTED"]


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_drop_anywhere_resumes_to_the_same_messages(version: str) -> None:
    """Logs with a pause, a continuation, a reasoning summary and a run cancelled mid-summary,
    cut after every frame (inside one stored event's events too): @ag-ui/client, through
    GatewayAgent, connects again from the cursor it kept (the prelude and the tail the gateway
    writes for it) and holds the messages of a client that never dropped."""
    cases = []
    for entries in (refund_log(), reasoning_log(), reasoning_log(cut=True)):
        dialect = Dialect.of("1.0" if version == "1.0" else None)
        full = ThreadProjection("t", dialect)
        frames = [(e.seq, ev) for e in entries for ev in full.apply(e)]
        for count in range(1, len(frames)):
            cut = frames[:count]
            if not any(ev["type"] == "RUN_STARTED" for _, ev in cut):
                continue  # nothing applied yet: the client would start from the beginning
            cursor = kept_cursor(cut)
            projection = ThreadProjection("t", dialect)
            for entry in entries:
                if entry.seq <= cursor:
                    projection.apply(entry)
            resume = [_frame(cursor, ev) for ev in projection.prelude()] + [
                _frame(e.seq, ev) for e in entries if e.seq > cursor for ev in projection.apply(e)
            ]
            cases.append(
                {
                    "full": b"".join(_frame(seq, ev) for seq, ev in frames).decode(),
                    "cut": b"".join(_frame(seq, ev) for seq, ev in cut).decode(),
                    "resume": b"".join(resume).decode(),
                    "cursor": str(cursor) if cursor else None,
                }
            )
    node = node_or_skip("@ag-ui/client")
    process = await asyncio.create_subprocess_exec(
        node,
        str(FRONTEND_PACKAGES / "ag_ui_replay.mjs"),
        cwd=FRONTEND_PACKAGES,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    config = json.dumps({"version": version, "cases": cases}).encode()
    out, err = await asyncio.wait_for(process.communicate(config), 120)
    assert process.returncode == 0, err.decode()
    results = json.loads(out.decode())
    assert len(results) == len(cases) > 40
    for case, result in zip(cases, results, strict=True):
        assert result["cursor"] == case["cursor"], (case["cut"][-300:], result)
        assert json.dumps(result["resumed"]) == json.dumps(result["steady"]), result
        assert result["steady"], result


def kept_cursor(received: list[tuple[int, dict[str, Any]]]) -> int:
    """The cursor GatewayAgent keeps after these frames: the newest stored event all of whose
    events it applied (a run's last event ends its stored event's events)."""
    group, kept = None, 0
    for seq, event in received:
        if group is not None and seq != group:
            kept = group
        group = seq
        if event["type"] in ("RUN_FINISHED", "RUN_ERROR"):
            kept = seq
    return kept
