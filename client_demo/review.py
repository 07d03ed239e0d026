"""`python -m client_demo review`: decide pending approvals from a terminal.

Subscribes to the tenant's approval inbox (`inbox.subscribe`), prints every pending approval
and asks `approve / reject <reason> / skip` on stdin, then sends `approval.decide`:

    approval ap_123: issue_refund {"order_id": 42, "amount": 30.0}
       agent assistant, thread t_1, run r_1, requested 2026-11-29T12:00:00.000Z
    approve / reject <reason> / skip > approve
    -- approved ap_123 (issue_refund)

`--auto approve|reject` decides every approval without asking; `--once` exits after the first
decision. An approval decided elsewhere while the prompt is open is dropped with a notice.
After a reconnect the inbox is fetched again; approvals already shown are not shown twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, TextIO

from client_demo.terminal import (
    ConnectionLost,
    FatalError,
    Output,
    ServerError,
    Session,
    StdinLines,
    TokenSource,
    compact_json,
)

PROMPT = "approve / reject <reason> / skip > "
DEFAULT_REJECT_REASON = "Rejected by the reviewer."
MAX_DECIDE_ATTEMPTS = 3


@dataclass
class ReviewOptions:
    ws_url: str
    tokens: TokenSource
    auto: str | None = None
    reason: str | None = None
    once: bool = False
    max_backoff: float = 10.0


@dataclass
class ReviewApp:
    options: ReviewOptions
    out: Output
    diag: Output
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: set[str] = field(default_factory=set)
    decided: set[str] = field(default_factory=set)
    inbox_loaded: bool = False

    def __post_init__(self) -> None:
        self.changed = asyncio.Event()
        self.session = Session(
            ws_url=self.options.ws_url,
            tokens=self.options.tokens,
            diag=self.diag,
            on_frame=self.on_frame,
            on_connected=self.on_connected,
            max_backoff=self.options.max_backoff,
        )

    async def main(self, stdin: StdinLines | None) -> int:
        session_task = asyncio.create_task(self.session.run(), name="session")
        decide_task = asyncio.create_task(self.decide_loop(stdin), name="decide")
        try:
            await asyncio.wait({session_task, decide_task}, return_when=asyncio.FIRST_COMPLETED)
            if session_task.done():
                session_task.result()  # a FatalError propagates
                return 1
            return decide_task.result()
        finally:
            self.session.stop()
            decide_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError, Exception):
                await asyncio.wait_for(session_task, 5)

    # -- inbox ----------------------------------------------------------------------------

    async def on_connected(self) -> None:
        try:
            await self.session.request("inbox.subscribe")
        except ServerError as exc:
            if exc.code in {"forbidden", "unauthorized"}:
                raise FatalError(
                    f"{exc} (the review command needs a token with the reviewer or admin role)"
                ) from None
            raise

    def on_frame(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind == "inbox":
            self.inbox_loaded = True
            approvals = [a for a in frame.get("approvals") or [] if isinstance(a, dict)]
            current = {str(a.get("approval_id")) for a in approvals}
            for approval_id in list(self.pending):
                if approval_id not in current:
                    self.pending.pop(approval_id)
            self._add(approvals)
        elif kind == "inbox.update":
            self._add([a for a in frame.get("added") or [] if isinstance(a, dict)])
            for approval_id in frame.get("removed") or []:
                self.pending.pop(str(approval_id), None)
        else:
            return
        self.changed.set()

    def _add(self, approvals: list[dict[str, Any]]) -> None:
        for approval in approvals:
            approval_id = str(approval.get("approval_id"))
            if approval_id not in self.decided and approval.get("status", "pending") == "pending":
                self.pending.setdefault(approval_id, approval)

    async def next_approval(self, stdin: StdinLines | None) -> dict[str, Any] | None:
        """The next approval to decide; None when stdin ended (nobody is left to answer)."""
        while True:
            self.changed.clear()
            for approval_id, approval in self.pending.items():
                if approval_id not in self.skipped and approval_id not in self.decided:
                    return approval
            if stdin is not None and stdin.exhausted() and self.inbox_loaded:
                return None
            if stdin is None or stdin.eof.is_set() or not self.inbox_loaded:
                await self.changed.wait()  # lines typed ahead wait for approvals to answer
                continue
            waiters = {
                asyncio.create_task(self.changed.wait()),
                asyncio.create_task(stdin.eof.wait()),
            }
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()

    # -- deciding -------------------------------------------------------------------------

    async def decide_loop(self, stdin: StdinLines | None) -> int:
        while True:
            approval = await self.next_approval(None if self.options.auto else stdin)
            if approval is None:
                return 0
            approval_id = str(approval["approval_id"])
            self.show(approval)
            if self.options.auto:
                decision = self.options.auto
                reason = (
                    (self.options.reason or DEFAULT_REJECT_REASON) if decision == "reject" else None
                )
            else:
                assert stdin is not None
                answer = await self.ask(stdin, approval_id)
                if answer is None:  # end of input
                    return 0
                if answer == ("gone", None):
                    self.out.line(f"-- {approval_id} was decided elsewhere")
                    continue
                decision, reason = answer
                if decision == "skip":
                    self.skipped.add(approval_id)
                    self.out.line(f"-- skipped {approval_id}")
                    continue
            if await self.decide(approval, decision, reason) and self.options.once:
                return 0

    def show(self, approval: dict[str, Any]) -> None:
        self.out.line(
            f"approval {approval.get('approval_id')}: {approval.get('tool_name')} "
            f"{compact_json(approval.get('arguments'))}"
        )
        self.out.line(
            f"   agent {approval.get('agent')}, thread {approval.get('thread_id')}, "
            f"run {approval.get('run_id')}, requested {approval.get('requested_at')}"
        )

    async def ask(self, stdin: StdinLines, approval_id: str) -> tuple[str, str | None] | None:
        """The reviewer's answer; ("gone", None) if someone else decided it meanwhile."""
        while True:
            self.out.write(PROMPT)
            self.out.at_line_start = True  # the answer's echo ends the line on a terminal
            line_task = asyncio.create_task(stdin.get())
            try:
                while not line_task.done():
                    if approval_id not in self.pending:
                        self.out.write("\n")
                        return ("gone", None)
                    self.changed.clear()
                    changed_task = asyncio.create_task(self.changed.wait())
                    await asyncio.wait(
                        {line_task, changed_task}, return_when=asyncio.FIRST_COMPLETED
                    )
                    changed_task.cancel()
                line = line_task.result()
            finally:
                line_task.cancel()
            if line is None:
                self.out.write("\n")
                return None
            if not stdin.is_tty:  # show piped answers, as a terminal would have
                self.out.write(line + "\n")
            if approval_id not in self.pending:
                return ("gone", None)
            parsed = parse_answer(line)
            if parsed is not None:
                return parsed
            self.out.line("please answer 'approve', 'reject <reason>' or 'skip'")

    async def decide(self, approval: dict[str, Any], decision: str, reason: str | None) -> bool:
        approval_id = str(approval["approval_id"])
        fields: dict[str, Any] = {"approval_id": approval_id, "decision": decision}
        if reason:
            fields["reason"] = reason
        for _ in range(MAX_DECIDE_ATTEMPTS):
            try:
                await self.session.request("approval.decide", **fields)
            except ConnectionLost:
                self.diag.line(
                    f"-- the connection dropped before the decision on {approval_id} was "
                    "confirmed; sending it again after reconnecting"
                )
                continue
            except ServerError as exc:
                self.diag.line(str(exc))
                if exc.code in {"conflict", "not_found"}:
                    self.decided.add(approval_id)
                    self.pending.pop(approval_id, None)
                else:
                    self.skipped.add(approval_id)
                return False
            self.decided.add(approval_id)
            self.pending.pop(approval_id, None)
            verb = "approved" if decision == "approve" else "rejected"
            self.out.line(f"-- {verb} {approval_id} ({approval.get('tool_name')})")
            return True
        self.skipped.add(approval_id)
        return False


def parse_answer(line: str) -> tuple[str, str | None] | None:
    """'approve' / 'a' / 'y', 'reject <reason>' / 'r <reason>' / 'n', 'skip' / 's' / ''."""
    text = line.strip()
    word, _, rest = text.partition(" ")
    word = word.lower()
    if word in {"approve", "a", "y", "yes"} and not rest.strip():
        return ("approve", None)
    if word in {"reject", "r", "n", "no"}:
        return ("reject", rest.strip() or None)
    if word in {"skip", "s", ""}:
        return ("skip", None)
    return None


async def run_review(options: ReviewOptions, stdout: TextIO, stderr: TextIO) -> int:
    out = Output(stdout)
    app = ReviewApp(options, out=out, diag=Output(stderr, partner=out))
    stdin = None if options.auto else StdinLines()
    return await app.main(stdin)
