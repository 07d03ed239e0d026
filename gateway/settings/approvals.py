"""Settings of approvals: who may decide them, and how long they may wait."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from gateway.settings.group import SettingsGroup


class ApprovalSettings(SettingsGroup):
    """Who may decide the approval a tool call waits for, and how long it may wait for one."""

    section_key: ClassVar[str] = "approvals"
    section_title: ClassVar[str] = "approvals"

    self_approval: bool = Field(
        False,
        description=(
            "Whether a thread's owner may decide the approvals of their own runs. Reviewers and "
            "admins always can. The default only: a tool whose agent graph says who decides it "
            "(`decided_by`: the run's own user, reviewers or either) follows that instead."
        ),
    )
    four_eyes: bool = Field(
        False,
        description=(
            "Four-eyes: the user who requested a run (sent the `run.start`, or the `run.input` that"
            " started it) may never approve a call of that run, even as a reviewer or admin and "
            "even with `GATEWAY_SELF_APPROVAL`; rejecting stays allowed. A run started later from "
            "queued input counts the thread's owner as its requester."
        ),
    )
    approval_ttl_s: float = Field(
        0.0,
        ge=0,
        description=(
            "Seconds (≥ 0) an approval may wait for a decision; `0` means forever. Past it the "
            "system rejects the approval (status `expired`, `approval.decided` with `expired: true`"
            ' and no reviewer); the model is told "The approval request expired after N seconds '
            'without a decision." and the run continues as after a rejection. A decision arriving '
            "later gets `conflict`. Applies to approvals requested while it is set; a changed value"
            " does not touch approvals already waiting."
        ),
    )
    approval_sweep_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description=(
            "Seconds (0 < s ≤ 3600) between looks for expired approvals, so an unattended approval "
            "expires at most this late. Only used when `GATEWAY_APPROVAL_TTL_S` is above 0; a late "
            "decision is refused at once either way."
        ),
    )
