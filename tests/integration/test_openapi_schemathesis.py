"""schemathesis against a real gateway process, driven by the OpenAPI document it serves.

Every operation gets generated requests (valid and invalid, within its examples, coverage and
fuzzing phases) with an admin's bearer token, and every response must be what the document
says: no 5xx, a documented status, a documented content type, a body matching its schema,
auth actually enforced. Then the operations that need real ids (a run, a thread, a pending
approval) are called with ids seeded beforehand, so success bodies are checked too, not only
the 404s random ids get. Seeded and bounded (MAX_EXAMPLES per operation).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from gateway.auth.access import TokenVerifier
from gateway.specs.openapi import openapi_document
from tests.support.client import Client
from tests.support.gateway import TEST_SECRET, GatewayProcess, spawn_gateway
from tests.support.seeds import run_seed

SEED = run_seed()  # fixed unless GATEWAY_TEST_SEED says otherwise (tests/support/seeds.py)
MAX_EXAMPLES = 25
TENANT = "acme"
# Issued now, valid for an hour: schemathesis must know the credentials when it loads the
# document (at collection), so that it can also leave them out on purpose.
ADMIN_TOKEN = TokenVerifier(TEST_SECRET).issue("root", TENANT, ["admin"])
# Hypothesis settings of every generated test: the same examples on every run.
FUZZ = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@dataclass(frozen=True)
class Seeded:
    """A running gateway and real objects in it."""

    gw: GatewayProcess
    thread_id: str
    run_id: str  # waiting for review
    pending_approval: str
    decided_approval: str

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.gw.port}"


async def seed(gw: GatewayProcess, verifier: TokenVerifier) -> dict[str, str]:
    """A thread with a finished run (an approval rejected by a reviewer) and a run waiting for
    review: threads, events, runs, approvals and the audit trail all have something in them."""
    url = f"ws://127.0.0.1:{gw.port}/v1/ws"
    alice = await Client.connect(url, verifier.issue("alice", TENANT, ["user"]))
    bob = await Client.connect(url, verifier.issue("bob", TENANT, ["reviewer"]))
    try:
        first = await alice.request("run.start", input="refund order 1 for 5")
        thread_id = first["thread_id"]
        requested = await alice.wait_event("approval.requested")
        decided = requested["data"]["approval_id"]
        await bob.request("approval.decide", approval_id=decided, decision="reject", reason="no")
        await alice.wait_event("run.completed")
        second = await alice.request(
            "run.input", thread_id=thread_id, input="refund order 42 for 30"
        )
        pending = await alice.wait_for(
            lambda f: f.get("event") == "approval.requested" and f["data"]["approval_id"] != decided
        )
        await alice.wait_for(
            lambda f: f.get("event") == "run.paused" and f.get("run_id") == second["run_id"]
        )
    finally:
        await alice.close()
        await bob.close()
    return {
        "thread_id": thread_id,
        "run_id": second["run_id"],
        "pending_approval": pending["data"]["approval_id"],
        "decided_approval": decided,
    }


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    gw = spawn_gateway(tmp_path_factory.mktemp("schemathesis"))
    try:
        verifier = TokenVerifier(TEST_SECRET)
        ids = asyncio.run(seed(gw, verifier))
        yield Seeded(gw=gw, **ids)
    finally:
        gw.terminate()
    failures = [
        line for line in gw.log().splitlines() if " ERROR " in line or "Exception in ASGI" in line
    ]
    assert not failures, "the gateway logged errors:\n" + "\n".join(failures[:10])


# The document the gateway serves is generated from the code, so it is loaded here at import,
# when pytest collects one test per operation (schemathesis' fixture-based loader does not
# work with this pytest); `test_the_tested_document_is_the_served_one` proves they are equal.
DOCUMENT = openapi_document()
schema = schemathesis.openapi.from_dict(
    DOCUMENT,
    config=schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "generation": {"mode": "all", "max-examples": MAX_EXAMPLES},
            "auth": {"openapi": {"bearerAuth": {"bearer": ADMIN_TOKEN}}},
        }
    ),
)


def test_the_tested_document_is_the_served_one(seeded: Seeded) -> None:
    response = requests.get(f"{seeded.base_url}/v1/openapi.json", timeout=10)
    assert response.status_code == 200
    assert response.json() == DOCUMENT


# The SSE feeds answer with a stream that stays open: tests/integration/test_sse.py reads them.
# The AG-UI and CopilotKit routes stream agent runs: the real clients drive them in
# tests/frontends/test_ag_ui.py.
@schema.exclude(path_regex=r"/stream$|^/v1/ag-ui/|^/v1/copilotkit|^/v1/ai-sdk/").parametrize()
@FUZZ
def test_every_operation_conforms_to_the_served_document(
    case: schemathesis.Case, seeded: Seeded
) -> None:
    if unknown_agent(case):
        # Which agents exist is the deployment's, not the document's: an unknown one is
        # `bad_request`, as for `run.start` on the WebSocket.
        response = case.call(base_url=seeded.base_url)
        case.validate_response(response, excluded_checks=[positive_data_acceptance])
        # (or whatever a request fails on first: the token, the media type, the thread).
        assert response.status_code in (400, 401, 403, 404, 415), response.text
        return
    if not inverted_audit_window(case):
        case.call_and_validate(base_url=seeded.base_url)
        return
    # `since` not before `until` is refused, a rule JSON Schema cannot state (the document
    # says it in words), so only here may schema-valid data get 400, and it must (unless the
    # case dropped the token: authentication comes first).
    response = case.call(base_url=seeded.base_url)
    case.validate_response(response, excluded_checks=[positive_data_acceptance])
    assert response.status_code in (400, 401), response.text


def unknown_agent(case: schemathesis.Case) -> bool:
    body = case.body if isinstance(case.body, dict) else {}
    if (case.method.upper(), case.path) != ("POST", "/v1/runs"):
        return False
    return body.get("agent") not in (None, "assistant")


def inverted_audit_window(case: schemathesis.Case) -> bool:
    query = case.query or {}
    if (case.method.upper(), case.path) != ("GET", "/v1/audit"):
        return False
    if "since" not in query or "until" not in query:
        return False
    try:
        since, until = (datetime.fromisoformat(str(query[k])) for k in ("since", "until"))
        since, until = (t if t.tzinfo else t.replace(tzinfo=UTC) for t in (since, until))
        return since >= until
    except (TypeError, ValueError):
        return False


@pytest.fixture(scope="module")
def dev_mode_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway without GATEWAY_SECRET: development tokens are on."""
    gw = spawn_gateway(tmp_path_factory.mktemp("devmode"), env={"GATEWAY_SECRET": ""})
    try:
        yield f"http://127.0.0.1:{gw.port}"
    finally:
        gw.terminate()


@schema.include(path="/v1/dev/token", method="POST").parametrize()
@FUZZ
def test_development_tokens_conform_in_development_mode(
    case: schemathesis.Case, dev_mode_url: str
) -> None:
    response = case.call_and_validate(base_url=dev_mode_url)
    if response.status_code == 200:
        # A token it hands out works on the API it was issued for.
        token = response.json()["token"]
        threads = requests.get(
            f"{dev_mode_url}/v1/threads", headers={"Authorization": f"Bearer {token}"}, timeout=10
        )
        assert threads.status_code in (200, 403), threads.text


def call(seeded: Seeded, path: str, method: str, **kwargs: Any) -> schemathesis.Response:
    case = schema[path][method].Case(**kwargs)
    return case.call_and_validate(
        base_url=seeded.base_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )


def test_success_bodies_conform_for_real_objects(seeded: Seeded) -> None:
    threads = call(seeded, "/v1/threads", "GET")
    # The fuzzed `POST /v1/runs` may have started threads of its own beside the seeded one.
    assert seeded.thread_id in [t["thread_id"] for t in threads.json()["threads"]]
    events = call(
        seeded,
        "/v1/threads/{thread_id}/events",
        "GET",
        path_parameters={"thread_id": seeded.thread_id},
    ).json()["events"]
    kinds = {e["event"] for e in events}
    assert {"approval.requested", "approval.decided", "run.paused", "run.completed"} <= kinds
    run = call(
        seeded, "/v1/runs/{run_id}", "GET", path_parameters={"run_id": seeded.run_id}
    ).json()["run"]
    assert run["status"] == "waiting_for_review"
    assert [a["approval_id"] for a in run["pending_approvals"]] == [seeded.pending_approval]
    inbox = call(seeded, "/v1/approvals", "GET").json()["approvals"]
    assert [a["approval_id"] for a in inbox] == [seeded.pending_approval]
    audit = call(seeded, "/v1/audit", "GET").json()
    assert any(entry["target"] == seeded.decided_approval for entry in audit["audit"])
    again = call(
        seeded,
        "/v1/approvals/{approval_id}/decision",
        "POST",
        path_parameters={"approval_id": seeded.decided_approval},
        body={"decision": "approve"},
    )
    assert again.status_code == 409
    decided = call(
        seeded,
        "/v1/approvals/{approval_id}/decision",
        "POST",
        path_parameters={"approval_id": seeded.pending_approval},
        body={"decision": "approve", "reason": "fine"},
    )
    assert decided.json()["approval"]["status"] == "approved"


@pytest.mark.parametrize("raw", ["1_0", "\u0663", " 5", "5 ", "0x10", "1e2", "9" * 5000])
def test_integer_query_parameters_are_plain_decimals(seeded: Seeded, raw: str) -> None:
    """The document says `integer`; Python's int() alone also reads `1_0`, non-ASCII digits
    and padded numbers, which a client could come to rely on."""
    response = requests.get(
        f"{seeded.base_url}/v1/threads",
        params={"limit": raw},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=10,
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "bad_request"
