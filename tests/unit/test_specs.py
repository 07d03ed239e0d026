"""The API documents against the code: routes, frame types, codes, and the committed files.

Each failure names what is missing where, and how to regenerate: `python -m gateway.specs`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from starlette.routing import Route, WebSocketRoute

from gateway.app import create_app
from gateway.protocol import frames as protocol
from gateway.protocol.close_codes import CloseCode
from gateway.protocol.error_codes import ERRORS, ErrorCode
from gateway.run_lifecycle.execution import approval_view
from gateway.specs.__main__ import PROTOCOL, documents, main, render
from gateway.specs.asyncapi import CLIENT_FRAMES, asyncapi_document
from gateway.specs.openapi import HTTP_ERRORS
from gateway.specs.protocol_tables import with_tables
from gateway.specs.shapes import event_data_models
from persistence.approvals import ApprovalRecord, ApprovalStatus
from tests.support.gateway import running_gateway
from tests.support.gateway import test_settings as gateway_settings
from tests.support.specs import ASYNCAPI_FILE, OPENAPI_FILE, ROOT, Spec, asyncapi, load, openapi

REGENERATE = "regenerate with `.venv/bin/python -m gateway.specs`"
HTTP_METHODS = {"get", "put", "post", "delete", "patch", "options", "head", "trace"}
# A number that is a close code, outside gateway/protocol/close_codes.py. 1000 is also a common
# round # number (page sizes, milliseconds): it counts only on a line that speaks of closing or
# codes.
CLOSE_CODE_NUMBER = re.compile(r"(?<![\w.])(\d{4})(?!\w|\.\d)")


def served_routes(tmp_path: Path) -> tuple[set[tuple[str, str]], set[str]]:
    app = create_app(gateway_settings(tmp_path / "routes.db"))
    http: set[tuple[str, str]] = set()
    sockets: set[str] = set()
    # The browser demo's static files are the router's fallback, not a route (nor an API).
    for route in app.routes:
        if isinstance(route, Route):
            # Starlette adds HEAD to every GET route by itself; the document lists GET.
            methods = set(route.methods or ()) - {"HEAD"}
            http |= {(method.upper(), route.path) for method in methods}
        elif isinstance(route, WebSocketRoute):
            sockets.add(route.path)
        else:
            raise AssertionError(f"unexpected route type {type(route).__name__} at {route}")
    return http, sockets


def documented_operations(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


def test_committed_documents_are_the_generator_output() -> None:
    for name, build in documents().items():
        path = ROOT / "docs" / name
        assert path.exists(), f"docs/{name} is missing; {REGENERATE}"
        assert path.read_text(encoding="utf-8") == render(build()), (
            f"docs/{name} differs from what the code generates; {REGENERATE}"
        )


def test_the_tables_of_the_protocol_reference_are_the_generator_output() -> None:
    text = (ROOT / "docs" / PROTOCOL).read_text(encoding="utf-8")
    assert text == with_tables(text), (
        f"the error-code or close-code table of docs/{PROTOCOL} differs from "
        f"gateway/protocol/error_codes.py and gateway/protocol/close_codes.py; {REGENERATE}"
    )
    for code, rule in ERRORS.items():
        assert f"| `{code}` | {int(rule.http_status)} |" in text, code
    for close in CloseCode:
        assert f"| {int(close)} | `{close.name.lower()}` |" in text, close


def test_a_protocol_reference_without_the_table_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="markers"):
        with_tables("## 7. Errors and close codes\n\n| code | HTTP | meaning |\n")


def test_check_mode_reports_stale_documents(tmp_path: Path, capsys) -> None:
    assert main(["--check", "--out", str(tmp_path)]) == 1
    assert "openapi.json" in capsys.readouterr().err
    assert main(["--out", str(tmp_path)]) == 0
    assert main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "asyncapi.json").write_text("{}\n")
    assert main(["--check", "--out", str(tmp_path)]) == 1
    assert main(["--out", str(tmp_path)]) == 0
    protocol_md = tmp_path / PROTOCOL
    protocol_md.write_text(protocol_md.read_text().replace("| 4029 |", "| 4030 |"))
    assert main(["--check", "--out", str(tmp_path)]) == 1
    assert main(["--out", str(tmp_path)]) == 0
    assert "| 4029 |" in protocol_md.read_text()


def test_every_http_route_is_documented_and_every_documented_route_exists(
    tmp_path: Path,
) -> None:
    served, _ = served_routes(tmp_path)
    documented = documented_operations(load(OPENAPI_FILE))
    undocumented = sorted(served - documented)
    missing = sorted(documented - served)
    assert not undocumented, (
        f"served but not in docs/openapi.json: {undocumented}; describe them in "
        f"gateway/specs/openapi.py and {REGENERATE}"
    )
    assert not missing, f"in docs/openapi.json but not served by the app: {missing}"


def test_the_websocket_route_is_the_asyncapi_channel(tmp_path: Path) -> None:
    _, sockets = served_routes(tmp_path)
    channels = {c["address"] for c in load(ASYNCAPI_FILE)["channels"].values()}
    assert sockets == channels, f"WebSocket routes {sorted(sockets)} vs channels {channels}"


def test_every_documented_operation_answers_its_errors_as_error_bodies() -> None:
    document = load(OPENAPI_FILE)
    for path, item in document["paths"].items():
        for method, operation in item.items():
            assert "200" in operation["responses"], f"{method.upper()} {path} has no 200"
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")) and path != "/readyz":
                    assert response.get("$ref", "").startswith("#/components/responses/"), (
                        f"{method.upper()} {path} {status} is not an error body"
                    )
            secured = operation.get("security", document["security"])
            if secured:
                assert "401" in operation["responses"], f"{method.upper()} {path} lacks 401"


def client_frame_types(document: dict[str, Any]) -> dict[str, str]:
    """Frame type -> schema, from the operations the gateway receives."""
    spec = Spec(document)
    found: dict[str, str] = {}
    for operation in document["operations"].values():
        if operation["action"] != "receive":
            continue
        for message_ref in operation["messages"]:
            key = message_ref["$ref"].rsplit("/", 1)[1]
            schema = document["components"]["messages"][key]["payload"]["$ref"].rsplit("/", 1)[1]
            found[spec.schemas[schema]["properties"]["type"]["const"]] = schema
    return found


def test_client_frame_types_match_the_parser() -> None:
    documented = set(client_frame_types(load(ASYNCAPI_FILE)))
    parsed = set(protocol.CLIENT_FRAME_TYPES)
    assert not parsed - documented, (
        f"parse_client_frame accepts {sorted(parsed - documented)} but docs/asyncapi.json does "
        f"not receive them; {REGENERATE}"
    )
    assert not documented - parsed, (
        f"docs/asyncapi.json receives {sorted(documented - parsed)} but the parser refuses them"
    )
    assert set(CLIENT_FRAMES) == parsed, (
        "gateway/specs/asyncapi.py CLIENT_FRAMES needs a summary and answers for "
        f"{sorted(parsed - set(CLIENT_FRAMES))} and has stale {sorted(set(CLIENT_FRAMES) - parsed)}"
    )


def test_error_codes_match_the_protocol() -> None:
    spec = asyncapi()
    documented = set(spec.schemas["ErrorCode"]["enum"])
    sent = {str(code) for code in ErrorCode}
    assert not sent - documented, (
        f"error codes missing from docs/asyncapi.json: {sent - documented}"
    )
    assert not documented - sent, f"documented error codes nothing sends: {documented - sent}"
    assert set(openapi().schemas["ErrorCode"]["enum"]) == documented
    assert set(ERRORS) == set(ErrorCode), (
        "gateway/protocol/error_codes.py ERRORS needs a row for every code"
    )
    # Every code but the hello's protocol check is answered over HTTP too.
    assert set(ErrorCode) - set(HTTP_ERRORS) == {ErrorCode.UNSUPPORTED_PROTOCOL}


def test_event_types_match_the_protocol() -> None:
    spec = asyncapi()
    logged = {str(event) for event in protocol.EventType} | set(protocol.ADDED_EVENTS)
    enum = set(spec.schemas["EventType"]["enum"])
    assert not logged - enum, f"events missing from docs/asyncapi.json EventType: {logged - enum}"
    assert not enum - logged, f"documented events the gateway never logs: {enum - logged}"
    shaped = {
        branch["properties"]["event"]["const"] for branch in spec.schemas["EventFrame"]["oneOf"]
    }
    assert not logged - shaped, (
        f"events without a `data` shape: {sorted(logged - shaped)}; add a model to "
        "event_data_models() in gateway/specs/shapes.py"
    )
    assert set(event_data_models()) == logged


def test_close_codes_match_the_code() -> None:
    documented = asyncapi().close_codes()
    assert documented == {int(code) for code in CloseCode}, (
        "docs/asyncapi.json x-close-codes differs from gateway/protocol/close_codes.py; "
        f"{REGENERATE}"
    )


def spelled_close_codes(text: str) -> list[str]:
    """Lines of `text` that spell a close code as a number instead of naming a CloseCode."""
    values = {int(code) for code in CloseCode}
    found = []
    for line in text.splitlines():
        numbers = {int(n) for n in CLOSE_CODE_NUMBER.findall(line)} & values
        if numbers - {1000} or (numbers and re.search(r"close|code", line, re.I)):
            found.append(line.strip())
    return found


def test_close_codes_are_spelled_only_in_the_enum() -> None:
    spelled = {
        str(module.relative_to(ROOT)): lines
        for module in sorted((ROOT / "gateway").rglob("*.py"))
        if module.name != "close_codes.py"
        and (lines := spelled_close_codes(module.read_text(encoding="utf-8")))
    }
    assert not spelled, (
        f"close codes spelled as numbers; use gateway.protocol.close_codes: {spelled}"
    )
    # The check itself can fail.
    assert spelled_close_codes("await websocket.close(code=1008)")
    assert spelled_close_codes("self._close_code or 1000")
    assert spelled_close_codes('"the socket is closed with 4009."')
    assert not spelled_close_codes("delay_s = 4009.5")
    assert not spelled_close_codes("MAX_EVENTS_PAGE = 1000")


def all_refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        found = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
        return found + [r for v in value.values() for r in all_refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in all_refs(v)]
    return []


def resolve(document: dict[str, Any], pointer: str) -> Any:
    assert pointer.startswith("#/"), f"external $ref {pointer}"
    node: Any = document
    for part in pointer[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict) and part in node, f"dangling $ref {pointer}"
        node = node[part]
    return node


@pytest.mark.parametrize("path", [OPENAPI_FILE, ASYNCAPI_FILE], ids=lambda p: p.name)
def test_documents_are_well_formed(path: Path) -> None:
    document = load(path)
    for pointer in all_refs(document):
        resolve(document, pointer)
    for name, schema in document["components"]["schemas"].items():
        try:
            Draft202012Validator.check_schema(schema)
        except Exception as exc:
            raise AssertionError(f"{path.name} schema {name} is not valid JSON Schema") from exc


def test_asyncapi_operations_use_the_channel_messages() -> None:
    document = load(ASYNCAPI_FILE)
    channel_messages = set(document["channels"]["gateway"]["messages"])
    for name, operation in document["operations"].items():
        refs = [m["$ref"] for m in operation["messages"]]
        refs += [m["$ref"] for m in operation.get("reply", {}).get("messages", [])]
        for message_ref in refs:
            assert message_ref.startswith("#/channels/gateway/messages/"), (name, message_ref)
            assert message_ref.rsplit("/", 1)[1] in channel_messages, (name, message_ref)


def approval(status: ApprovalStatus) -> ApprovalRecord:
    now = datetime(2026, 11, 29, 12, 0, 0, 123000, tzinfo=UTC)
    decided = status is not ApprovalStatus.PENDING
    return ApprovalRecord(
        approval_id="ap_1",
        run_id="r_1",
        thread_id="t_1",
        tenant="acme",
        checkpoint_version=1,
        call_id="call_1",
        tool_name="issue_refund",
        agent="assistant",
        arguments={"order_id": 42, "amount": 30.0},
        arguments_digest="d",
        status=status,
        reviewer="bob" if decided else None,
        reason=None,
        requested_at=now,
        decided_at=now if decided else None,
    )


def test_frames_the_protocol_builds_match_the_asyncapi_schemas() -> None:
    spec = asyncapi()
    pending = approval_view(approval(ApprovalStatus.PENDING))
    decided = approval_view(approval(ApprovalStatus.APPROVED))
    ts = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    frames = [
        protocol.welcome(
            user="alice",
            tenant="acme",
            roles=["user"],
            heartbeat_s=20.0,
            server_name="agents-ws-gateway",
            server_version="0.1.0",
        ),
        protocol.ack("c1", thread_id="t_1", epoch="e1"),
        protocol.ack("d1", approval=decided),
        protocol.ack("i1", disposition="staged", run_id="r_1"),
        protocol.error_frame("x", protocol.ErrorCode.CONFLICT, "approval already approved"),
        protocol.error_frame(None, protocol.ErrorCode.BAD_REQUEST, "frame is not valid JSON"),
        protocol.subscribed("t_1", "e1", 3, False),
        protocol.event_frame("t_1", 1, "r_1", "run.started", ts, {"input": "hi", "agent": "a"}),
        protocol.event_frame("t_1", 2, "r_1", "run.cancelled", ts, {}),
        protocol.inbox([pending]),
        protocol.inbox_update([pending], ["ap_2"]),
        protocol.ping(),
        protocol.pong(),
    ]
    for frame in frames:
        schema = spec.server_frame_schema(frame["type"])
        assert spec.errors(schema, frame) == [], frame
    assert spec.errors("Approval", decided) == []


def test_every_frame_the_protocol_module_builds_is_documented() -> None:
    source = (ROOT / "gateway" / "protocol" / "frames.py").read_text()
    built = set(re.findall(r'\{\s*"type":\s*"([a-z.]+)"', source))
    documented = set(asyncapi_document()["components"]["messages"])
    missing = sorted(t for t in built if f"server.{t}" not in documented)
    assert built and not missing, (
        f"gateway/protocol/frames.py builds {missing} frames that docs/asyncapi.json does not "
        f"send; add a model to SERVER_FRAMES in gateway/specs/shapes.py and {REGENERATE}"
    )


def test_the_schemas_refuse_what_the_gateway_never_sends() -> None:
    """The schemas must be able to fail, or the tests that rely on them prove nothing."""
    spec = asyncapi()
    ts = "2026-11-29T12:00:00.000Z"
    bad_event = {"type": "event", "thread_id": "t", "seq": 1, "run_id": None, "ts": ts}
    assert spec.errors("EventFrame", {**bad_event, "event": "run.started", "data": {}})
    assert spec.errors("EventFrame", {**bad_event, "event": "no.such", "data": {}})
    assert spec.errors("EventFrame", {**bad_event, "seq": 0, "event": "run.cancelled", "data": {}})
    assert spec.errors("ErrorFrame", {"type": "error", "ref": None, "code": "nope", "message": ""})
    assert spec.errors("SubscribedFrame", {"type": "subscribed", "thread_id": "t"})
    assert spec.errors("Approval", {**approval_view(approval(ApprovalStatus.PENDING)), "status": 1})


def test_asyncapi_generation_is_deterministic() -> None:
    assert render(asyncapi_document()) == render(asyncapi_document())


async def test_served_documents_equal_the_committed_files(tmp_path: Path) -> None:
    async with running_gateway(gateway_settings(tmp_path / "served.db")) as gw, gw.http() as http:
        for name in ("openapi.json", "asyncapi.json"):
            response = await http.get(f"/v1/{name}")
            assert response.status_code == 200, response.text
            assert response.headers["content-type"] == "application/json"
            assert response.json() == load(ROOT / "docs" / name), (
                f"GET /v1/{name} differs from docs/{name}; {REGENERATE}"
            )
