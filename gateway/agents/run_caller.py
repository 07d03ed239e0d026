"""Who a run runs for, as the graph's context factory and tools see it (docs/agents.md "Context").

The gateway describes every run to its graph: the user it runs for, their tenant and roles, the
token claims the graph asked for, the thread, the run, the agent, and who decided the run's
latest approval. The description is rebuilt at every start and restore from the run's row and
its approvals, never from client input or from the checkpoint: a continuation after a decision
sees who decided, and a run continued by another process sees the same caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.protocol.identity import Principal
from persistence.approvals import ApprovalRecord, ApprovalStatus
from persistence.runs import RunRecord

# The decisions `decided_by` names the reviewer of (a superseded approval was never decided).
DECISIONS = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.EXPIRED)


@dataclass(frozen=True)
class RunCaller:
    # Who asked for the run: started it, or sent the input that started it.
    user: str
    tenant: str
    roles: frozenset[str]
    # The token claims the graph named in `context_claims` (claim path -> value) that the
    # token carried. hash=False: a dict value must not make the frozen caller unhashable;
    # repr=False: claims can be personal data (an email), and a repr can end up in a log.
    claims: Mapping[str, Any] = field(hash=False, repr=False)
    thread_id: str
    run_id: str
    agent: str
    # The reviewer of the run's latest decision; None before any, or when the system decided
    # it (an expiry).
    decided_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "tenant": self.tenant,
            "roles": sorted(self.roles),
            "claims": dict(self.claims),
            "thread_id": self.thread_id,
            "run_id": self.run_id,
            "agent": self.agent,
            "decided_by": self.decided_by,
        }


def stored_caller(principal: Principal, claim_paths: Iterable[str]) -> dict[str, Any]:
    """What a run's row keeps of the token that asked for it (`runs.caller`): its roles and the
    claims the graph asked for. The rest of the caller is in the row already."""
    roles = {role.value for role in principal.roles} | set(principal.extra_roles)
    claims = {path: principal.claims[path] for path in claim_paths if path in principal.claims}
    return {"roles": sorted(roles), "claims": claims}


def caller_of(run: RunRecord, decided_by: str | None = None) -> RunCaller:
    """The caller of `run` as its row describes it (rows from before `runs.caller`: no roles
    and no claims)."""
    stored = run.caller or {}
    return RunCaller(
        user=run.requested_by or run.owner,
        tenant=run.tenant,
        roles=frozenset(str(role) for role in stored.get("roles", ())),
        claims=dict(stored.get("claims", {})),
        thread_id=run.thread_id,
        run_id=run.run_id,
        agent=run.agent,
        decided_by=decided_by,
    )


def latest_decision(approvals: Iterable[ApprovalRecord]) -> ApprovalRecord | None:
    decided = [a for a in approvals if a.status in DECISIONS and a.decided_at is not None]
    return max(decided, key=lambda a: (a.decided_at, a.approval_id), default=None)
