"""What the operator's commands print: one JSON shape per record for scripts (`--json`), and
the same facts as aligned tables for people.

Tool arguments are never printed, not even their digest: approval rows keep the real values of
sensitive arguments (gateway/run_lifecycle/sensitive_arguments.py), and a terminal is no place for
them. Whoever needs them can read the database they came from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TextIO

import orjson

from gateway.protocol.frames import utc_ts
from persistence.approvals import ApprovalRecord
from persistence.runs import LeasedRun
from persistence.threads import ThreadRecord

NONE = "-"


def seconds_between(earlier: datetime, later: datetime) -> float:
    return round(max(0.0, (later - earlier).total_seconds()), 3)


def human_duration(seconds: float) -> str:
    """`45s`, `12m05s`, `3h02m`, `2d04h`: two units at most, enough to compare waits."""
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def lease_view(leased: LeasedRun, now: datetime) -> dict[str, Any] | None:
    lease = leased.lease
    if lease is None:
        return None
    return {"owner": lease.owner, "expires_at": utc_ts(lease.expires_at), "live": lease.live(now)}


def run_view(leased: LeasedRun, now: datetime) -> dict[str, Any]:
    run = leased.run
    return {
        "run_id": run.run_id,
        "thread_id": run.thread_id,
        "tenant": run.tenant,
        "owner": run.owner,
        "requested_by": run.requested_by,
        "status": run.status.value,
        "agent": run.agent,
        "graph_version": run.graph_version,
        "created_at": utc_ts(run.created_at),
        "updated_at": utc_ts(run.updated_at),
        # Since the last status change: how long a run has been stuck where it is.
        "in_status_s": seconds_between(run.updated_at, now),
        "lease": lease_view(leased, now),
    }


def run_detail(
    leased: LeasedRun,
    thread: ThreadRecord | None,
    approvals: Sequence[ApprovalRecord],
    now: datetime,
) -> dict[str, Any]:
    run = leased.run
    return {
        **run_view(leased, now),
        "on_disconnect": run.on_disconnect,
        "checkpoint_version": run.checkpoint_version,
        "input": run.input,
        "error": run.error,
        "thread_head_seq": thread.head_seq if thread else None,
        "approvals": [decision_view(a) for a in approvals],
    }


def decision_view(approval: ApprovalRecord) -> dict[str, Any]:
    """An approval of the run's current checkpoint, as `runs show` lists it."""
    return {
        "approval_id": approval.approval_id,
        "tool_name": approval.tool_name,
        "call_id": approval.call_id,
        "status": approval.status.value,
        "requested_at": utc_ts(approval.requested_at),
        "reviewer": approval.reviewer,
        "decided_at": utc_ts(approval.decided_at) if approval.decided_at else None,
    }


def pending_view(approval: ApprovalRecord, now: datetime) -> dict[str, Any]:
    return {
        "approval_id": approval.approval_id,
        "run_id": approval.run_id,
        "thread_id": approval.thread_id,
        "tenant": approval.tenant,
        "tool_name": approval.tool_name,
        "agent": approval.agent,
        "call_id": approval.call_id,
        "requested_at": utc_ts(approval.requested_at),
        "waiting_s": seconds_between(approval.requested_at, now),
        "expires_at": utc_ts(approval.expires_at) if approval.expires_at else None,
    }


def lease_text(lease: dict[str, Any] | None) -> str:
    if lease is None:
        return NONE
    return f"{lease['owner']} ({'live' if lease['live'] else 'expired'})"


def run_cells(view: dict[str, Any]) -> list[str]:
    return [
        view["run_id"],
        view["thread_id"],
        view["tenant"],
        view["status"],
        human_duration(view["in_status_s"]),
        view["created_at"],
        lease_text(view["lease"]),
    ]


def thread_view(thread: ThreadRecord) -> dict[str, Any]:
    return {
        "thread_id": thread.thread_id,
        "tenant": thread.tenant,
        "owner": thread.owner,
        "title": thread.title,
        "created_at": utc_ts(thread.created_at),
        "events": thread.head_seq,
        "archived_at": utc_ts(thread.archived_at) if thread.archived_at else None,
    }


def thread_cells(view: dict[str, Any]) -> list[str]:
    title = view["title"] or NONE
    return [
        view["thread_id"],
        view["tenant"],
        view["owner"],
        str(view["events"]),
        view["created_at"],
        "archived" if view["archived_at"] else NONE,
        title if len(title) <= 40 else f"{title[:39]}…",
    ]


THREAD_COLUMNS = ["THREAD", "TENANT", "OWNER", "EVENTS", "CREATED", "ARCHIVED", "TITLE"]
RUN_COLUMNS = ["RUN", "THREAD", "TENANT", "STATE", "IN STATE", "CREATED", "LEASE"]
APPROVAL_COLUMNS = [
    "APPROVAL",
    "RUN",
    "THREAD",
    "TENANT",
    "TOOL",
    "WAITING",
    "REQUESTED",
    "EXPIRES",
]


def approval_cells(view: dict[str, Any]) -> list[str]:
    return [
        view["approval_id"],
        view["run_id"],
        view["thread_id"],
        view["tenant"],
        view["tool_name"],
        human_duration(view["waiting_s"]),
        view["requested_at"],
        view["expires_at"] or NONE,
    ]


def write_table(out: TextIO, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(columns, *rows, strict=True)]
    for row in [columns, *rows]:
        out.write("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        out.write("\n")


def write_list(
    out: TextIO,
    views: Sequence[dict[str, Any]],
    as_json: bool,
    columns: Sequence[str],
    cells: Callable[[dict[str, Any]], Sequence[str]],
) -> None:
    """A listing: a JSON array of the views, or a table of their `cells`."""
    if as_json:
        write_json(out, list(views))
    else:
        write_table(out, columns, [cells(view) for view in views])


def write_fields(out: TextIO, view: dict[str, Any]) -> None:
    """`runs show` for people: one `name: value` line per field, then the approvals."""
    fields = {k: v for k, v in view.items() if k not in ("approvals", "lease")}
    fields["lease"] = lease_text(view["lease"])
    if view["lease"] is not None:
        fields["lease"] += f", until {view['lease']['expires_at']}"
    fields["in_status_s"] = human_duration(view["in_status_s"])
    fields = {("in_status" if k == "in_status_s" else k): v for k, v in fields.items()}
    width = max(len(name) for name in fields)
    for name, value in fields.items():
        text = NONE if value is None else value
        if isinstance(text, dict):
            text = orjson.dumps(text).decode()
        out.write(f"{name.ljust(width)}  {text}\n")
    if view["approvals"]:
        out.write("\napprovals of the current checkpoint:\n")
        write_table(
            out,
            ["APPROVAL", "TOOL", "STATUS", "REQUESTED", "REVIEWER"],
            [
                [
                    a["approval_id"],
                    a["tool_name"],
                    a["status"],
                    a["requested_at"],
                    a["reviewer"] or NONE,
                ]
                for a in view["approvals"]
            ],
        )


def write_json(out: TextIO, value: Any) -> None:
    out.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())
    out.write("\n")
