"""Values the docs state are the code's: statuses, error codes, id prefixes, schema revisions,
event names, limits. An operator copies them into queries and scripts, so a doc that says
`needs_reconciliation` where the table stores `reconcile` finds nothing.

Each test reads every page of README.md and docs/ and checks one kind of value against the
enum or constant that defines it.
"""

from __future__ import annotations

import re
from pathlib import Path

from gateway.auth.audit_trail import AuditAction
from gateway.event_log.writer import MAX_MERGED_DELTA_CHARS
from gateway.protocol import frames
from gateway.protocol.error_codes import ErrorCode
from gateway.protocol.frames import CLIENT_FRAME_TYPES, EventType
from persistence.approvals import ApprovalStatus
from persistence.inputs import Disposition
from persistence.ledger import OperationStatus
from persistence.run_status import RunStatus
from persistence.schema import head_revision
from persistence.webhooks import WEBHOOK_TYPES, DeliveryStatus
from tests.support.gateway import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# benchmarks.md is a record of measurements taken on older trees: its revisions and outputs
# are history, not statements about this one.
CURRENT_PAGES = [page for page in PAGES if page.name != "benchmarks.md"]
# The pages about the server's state (docs/frontend.md's statuses are the client library's).
SERVER_PAGES = [page for page in CURRENT_PAGES if page.name != "frontend.md"]
STATUSES = {
    s.value
    for enum in (RunStatus, OperationStatus, ApprovalStatus, DeliveryStatus, Disposition)
    for s in enum
}
# "status (`a`, `b` or `c`)", "statuses (`a`, `b`)", "with status `a`", "status `a`".
STATUS_LIST = re.compile(r"status(?:es)?\s+\(((?:`[a-z_]+`(?:,\s*|\s+or\s+|\s+and\s+)?)+)\)")
ONE_STATUS = re.compile(r"\bstatus\s+`([a-z_]+)`")
REFUSED_WITH = re.compile(r"\b(?:refused|answered|rejected|fails|failed) with `([a-z_]+)`")
ID_EXAMPLE = re.compile(r'"(thread_id|run_id|approval_id)":\s*"([a-z]+)_')
ID_PREFIXES = {"thread_id": "t", "run_id": "r", "approval_id": "ap"}
REVISION = re.compile(r"\brevision (\d{4}), newest (\d{4})|created at revision (\d{4})")


def texts(pages: list[Path]) -> list[tuple[Path, str]]:
    # Joined lines: a value's sentence may wrap.
    return [(page, re.sub(r"\s*\n\s*", " ", page.read_text())) for page in pages]


def test_every_status_the_docs_name_is_one_the_code_stores() -> None:
    wrong: list[str] = []
    for page, text in texts(SERVER_PAGES):
        for listed in STATUS_LIST.findall(text):
            wrong += [f"{page.name}: {v}" for v in re.findall(r"`([a-z_]+)`", listed)]
        wrong += [f"{page.name}: {v}" for v in ONE_STATUS.findall(text)]
    wrong = [w for w in wrong if w.split(": ")[1] not in STATUSES]
    assert not wrong, f"statuses the code never stores: {wrong}"


def test_the_reconciliation_status_is_the_ledger_s() -> None:
    assert OperationStatus.NEEDS_RECONCILIATION.value == "reconcile"
    for page, text in texts(PAGES):
        # The event is `tool.needs_reconciliation`; no row ever has that status.
        bare = re.findall(r"(?<![.\w-])`?needs_reconciliation`?(?![\w-])", text)
        assert not bare, f"{page.name} calls a status needs_reconciliation: {bare}"


def test_error_codes_the_docs_promise_are_the_code_s() -> None:
    codes = {code.value for code in ErrorCode}
    for page, text in texts(PAGES):
        named = {c for c in REFUSED_WITH.findall(text) if c not in {"null"}}
        unknown = {c for c in named if c not in codes}
        assert not unknown, f"{page.name} names error codes the gateway never sends: {unknown}"


def test_inputs_over_the_limit_are_too_large_as_the_docs_say() -> None:
    text = dict(texts(PAGES))[ROOT / "docs" / "operations.md"]
    assert "`GATEWAY_MAX_INPUT_CHARS` are refused with `too_large`" in text
    assert ErrorCode.TOO_LARGE.value == "too_large"


def test_example_ids_carry_the_prefixes_the_gateway_gives() -> None:
    for page, text in texts(PAGES):
        for field, prefix in ID_EXAMPLE.findall(text):
            assert prefix == ID_PREFIXES[field], f"{page.name}: {field} {prefix}_…"
    code = "\n".join(p.read_text() for p in (ROOT / "gateway").rglob("*.py"))
    for prefix in ID_PREFIXES.values():
        assert f'new_id("{prefix}")' in code, prefix


def test_schema_revisions_in_the_docs_are_this_gateway_s() -> None:
    head = head_revision()
    for page, text in texts(CURRENT_PAGES):
        for match in REVISION.finditer(text):
            said = [value for value in match.groups() if value]
            assert set(said) == {head}, f"{page.name}: {match.group(0)} (head is {head})"


def test_event_and_frame_names_the_docs_use_exist() -> None:
    known = {e.value for e in EventType} | set(CLIENT_FRAME_TYPES) | set(WEBHOOK_TYPES)
    known |= {action.value for action in AuditAction}
    known |= {
        value
        for name, value in vars(frames).items()
        if name.isupper() and isinstance(value, str) and "." in value
    }
    checked = 0
    for page in CURRENT_PAGES:
        # The tables that document events, frames, audit actions and webhook types: each
        # row's first cell names them.
        rows = re.findall(r"^\| ((?:`[a-z_]+\.[a-z_.]+`(?:, )?)+) \|", page.read_text(), re.M)
        named = {name for row in rows for name in re.findall(r"`([^`]+)`", row)}
        named = {n for n in named if n.split(".")[0] in DOTTED_KINDS}
        checked += len(named)
        assert named <= known, (
            f"{page.name} names events or frames that do not exist: {named - known}"
        )

    assert checked > 20  # the protocol's event tables were found


DOTTED_KINDS = {"run", "message", "approval", "tool", "input", "reasoning", "thread", "agent"}


def test_the_merged_delta_limit_in_the_protocol_is_the_writer_s() -> None:
    text = dict(texts(PAGES))[ROOT / "docs" / "protocol.md"]
    assert f"up to {MAX_MERGED_DELTA_CHARS:,} characters" in text
    assert "one model delta per event" not in text


def test_the_reviewer_role_the_agents_guide_refers_back_to_is_its_example_s() -> None:
    text = (ROOT / "docs" / "agents.md").read_text()
    for role in re.findall(r"\(`(\w+)` above\)", text):
        before = text[: text.index(f"(`{role}` above)")]
        assert f'"{role}"' in before, f"docs/agents.md refers to `{role}` above; it is not there"
