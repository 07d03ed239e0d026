"""`python -m client_demo chat`: talk to an agent from a terminal.

Each stdin line is one user input: the first starts a run on a new thread (`run.start`), later
ones go to the same thread (`run.input`: started, staged or queued). Everything that happens on
the thread is printed as it arrives, on stdout:

    you: refund order 42 for 30 dollars
    -- status: running
    assistant: I will refund 30.00 USD for order 42; this needs your approval.
    -- tool call: issue_refund {"order_id": 42, "amount": 30.0}
    -- waiting for a reviewer: issue_refund {"order_id": 42, "amount": 30.0}
    -- status: waiting_for_review
    -- approved by bob
    -- status: running
    -- tool output: issue_refund: Refund of 30.00 USD issued for order 42 (ref RF-...)
    assistant: Here is what happened: ...
    -- status: completed

Message text is written delta by delta exactly as the server sent it, right after
`<agent>: `, and is followed by one newline when the message completes. A message the server
aborts (a gateway crash mid-stream, an immediate cancel) is followed by a line `[interrupted]`:
its partial text above is void, and the regenerated message follows as a new message.
Connection notices and `error <code>: <message>` lines go to stderr.

Events are applied by `seq`: after a reconnect the client subscribes with `after_seq` = the last
seq it applied, skips anything at or below it and re-subscribes on a gap, so nothing is printed
twice and nothing is missed. On end of input the client exits once no run is active.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
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

TERMINAL_EVENTS = {"run.completed", "run.failed", "run.cancelled"}


@dataclass
class _Message:
    agent: str
    printed: str = ""


@dataclass
class ChatOptions:
    ws_url: str
    tokens: TokenSource
    thread_id: str | None = None
    agent: str | None = None
    max_backoff: float = 10.0


@dataclass
class ChatApp:
    options: ChatOptions
    out: Output
    diag: Output
    stdin_is_tty: bool = False

    thread_id: str | None = None
    epoch: str | None = None
    last_seq: int = 0
    head_seq: int | None = None
    resyncing: bool = False
    accept_any_next: bool = False
    messages: dict[str, _Message] = field(default_factory=dict)
    current_message: str | None = None
    last_message_text: str | None = None
    runs_seen: set[str] = field(default_factory=set)
    runs_finished: set[str] = field(default_factory=set)
    runs_acked: set[str] = field(default_factory=set)
    queued_inputs: int = 0
    inflight: int = 0
    eof: bool = False
    sent_inputs: list[str] = field(default_factory=list)
    announced_thread: bool = False

    def __post_init__(self) -> None:
        self.thread_id = self.options.thread_id
        self.ready = asyncio.Event()
        self.done = asyncio.Event()
        self.session = Session(
            ws_url=self.options.ws_url,
            tokens=self.options.tokens,
            diag=self.diag,
            on_frame=self.on_frame,
            on_connected=self.on_connected,
            on_disconnected=self.ready.clear,
            max_backoff=self.options.max_backoff,
        )

    # -- main -----------------------------------------------------------------------------

    async def main(self, stdin: StdinLines) -> int:
        session_task = asyncio.create_task(self.session.run(), name="session")
        input_task = asyncio.create_task(self.read_inputs(stdin), name="inputs")
        done_task = asyncio.create_task(self.done.wait(), name="done")
        try:
            await asyncio.wait({session_task, done_task}, return_when=asyncio.FIRST_COMPLETED)
            if session_task.done():
                session_task.result()  # a FatalError propagates
                return 1
            return 0
        finally:
            self.session.stop()
            for task in (input_task, done_task):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError, Exception):
                await asyncio.wait_for(session_task, 5)

    async def read_inputs(self, stdin: StdinLines) -> None:
        while True:
            line = await stdin.get()
            if line is None:
                break
            if line.strip():
                await self.send_input(line)
        self.eof = True
        self.check_done()

    async def send_input(self, text: str) -> None:
        await self.ready.wait()
        self.inflight += 1
        self.sent_inputs.append(text)
        try:
            if self.thread_id is None:
                fields: dict[str, Any] = {"input": text}
                if self.options.agent:
                    fields["agent"] = self.options.agent
                ack = await self.session.request("run.start", **fields)
                self.thread_id = self.thread_id or ack["thread_id"]
                self.runs_acked.add(ack["run_id"])
                self.runs_seen.add(ack["run_id"])
            else:
                ack = await self.session.request("run.input", thread_id=self.thread_id, input=text)
                disposition = ack.get("disposition")
                if disposition == "started" and ack.get("run_id"):
                    self.runs_acked.add(ack["run_id"])
                    self.runs_seen.add(ack["run_id"])
                elif disposition == "queued":
                    self.queued_inputs += 1
        except ServerError as exc:
            self.diag.line(str(exc))
        except ConnectionLost:
            self.diag.line(
                "-- the connection dropped before the server confirmed this input; it may not "
                "have been taken (type it again if it does not show up)"
            )
        finally:
            self.inflight -= 1
            self.check_done()

    def check_done(self) -> None:
        if not self.eof or self.inflight or self.resyncing:
            return
        if self.thread_id is not None:
            if self.head_seq is None or self.last_seq < self.head_seq:
                return  # not caught up with the thread yet
            if self.runs_seen - self.runs_finished or self.queued_inputs:
                return
        self.done.set()

    # -- connection hooks -----------------------------------------------------------------

    async def on_connected(self) -> None:
        if self.thread_id is not None:
            await self.subscribe()
        self.ready.set()

    async def subscribe(self) -> None:
        assert self.thread_id is not None
        fields: dict[str, Any] = {"thread_id": self.thread_id, "after_seq": self.last_seq}
        if self.epoch is not None:
            fields["epoch"] = self.epoch
        try:
            await self.session.request("thread.subscribe", **fields)
        except ServerError as exc:
            if exc.code in {"not_found", "forbidden", "unauthorized"}:
                raise FatalError(str(exc)) from None
            raise

    async def resubscribe(self) -> None:
        with contextlib.suppress(ConnectionLost, ServerError):
            await self.subscribe()

    # -- frames ---------------------------------------------------------------------------

    def on_frame(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind == "subscribed":
            self.on_subscribed(frame)
        elif kind == "event":
            self.on_event(frame)

    def on_subscribed(self, frame: dict[str, Any]) -> None:
        thread_id = frame.get("thread_id")
        if self.thread_id is None:
            self.thread_id = thread_id
        if thread_id != self.thread_id:
            return
        if not self.announced_thread:
            self.announced_thread = True
            self.diag.line(f"-- thread {thread_id} (continue it later with --thread {thread_id})")
        self.epoch = frame.get("epoch") or self.epoch
        self.head_seq = int(frame.get("head_seq") or 0)
        self.resyncing = False
        if frame.get("reset"):
            self.out.line("-- the server reset this thread's history; showing it again")
            self.last_seq = 0
            self.accept_any_next = True
            self.messages.clear()
            self.current_message = None
        self.check_done()

    def on_event(self, frame: dict[str, Any]) -> None:
        thread_id = frame.get("thread_id")
        if self.thread_id is None:
            self.thread_id = thread_id
        if thread_id != self.thread_id or self.resyncing:
            return
        seq = int(frame.get("seq") or 0)
        if self.accept_any_next:
            self.accept_any_next = False
        elif seq <= self.last_seq:
            return  # already applied
        elif seq != self.last_seq + 1:
            self.diag.line(f"-- missed events {self.last_seq + 1}..{seq - 1}; catching up")
            self.resyncing = True
            asyncio.get_running_loop().create_task(self.resubscribe())
            return
        self.last_seq = seq
        self.apply(frame)
        self.check_done()

    # -- printing -------------------------------------------------------------------------

    def status(self, text: str) -> None:
        self.out.line(f"-- status: {text}")

    def begin_message(self, message_id: str, agent: str) -> _Message:
        message = self.messages.get(message_id)
        if message is None:
            message = self.messages[message_id] = _Message(agent)
        self.out.newline()
        self.out.write(f"{message.agent}: ")
        self.current_message = message_id
        return message

    def end_message(self) -> None:
        self.out.newline()
        self.current_message = None

    def apply(self, frame: dict[str, Any]) -> None:
        event = frame.get("event")
        data: dict[str, Any] = frame.get("data") or {}
        run_id = frame.get("run_id")
        match event:
            case "run.started":
                if run_id:
                    if run_id not in self.runs_acked and self.queued_inputs:
                        self.queued_inputs -= 1
                    self.runs_seen.add(run_id)
                text = str(data.get("input", ""))
                if self._should_echo(text):
                    self.out.line(f"you: {text}")
                self.status("running")
            case "message.started":
                self.begin_message(str(data.get("message_id")), str(data.get("agent") or "agent"))
            case "message.delta":
                message_id = str(data.get("message_id"))
                message = self.messages.get(message_id)
                if message is None or self.current_message != message_id:
                    agent = message.agent if message else "agent"
                    message = self.begin_message(message_id, agent)
                delta = str(data.get("delta") or "")
                message.printed += delta
                self.out.write(delta)
            case "message.completed":
                self.complete_message(str(data.get("message_id")), str(data.get("text") or ""))
            case "message.aborted":
                if self.messages.pop(str(data.get("message_id")), None) is not None:
                    self.end_message()
                    # A stop keeps what was streamed; any other cut drops it (docs/protocol.md §6).
                    kept = data.get("reason") == "cancelled" and "text" in data
                    self.out.line("[stopped]" if kept else "[interrupted]")
            case "reasoning.completed":
                self.out.line(f"-- thinking: {data.get('text')}")
            case "reasoning.started" | "reasoning.delta" | "model.usage":
                # A summary is shown once whole; token counts are the operator's business.
                pass
            case "tool.called":
                self.out.line(
                    f"-- tool call: {data.get('tool_name')} {compact_json(data.get('arguments'))}"
                )
            case "tool.output":
                self.out.line(f"-- tool output: {data.get('tool_name')}: {data.get('output')}")
            case "approval.requested":
                self.out.line(
                    f"-- waiting for a reviewer: {data.get('tool_name')} "
                    f"{compact_json(data.get('arguments'))}"
                )
            case "approval.decided":
                who = data.get("reviewer") or "a reviewer"
                if data.get("decision") == "approve":
                    self.out.line(f"-- approved by {who}")
                else:
                    reason = data.get("reason")
                    self.out.line(f"-- rejected by {who}" + (f": {reason}" if reason else ""))
            case "run.paused":
                reason = data.get("reason")
                if reason == "approval":
                    self.status("waiting_for_review")
                else:
                    self.status(f"suspended ({reason})")
            case "run.resumed":
                self.status("running")
            case "run.recovered":
                version = data.get("checkpoint_version")
                where = (
                    f"continues from checkpoint {version}"
                    if version is not None
                    else "starts again from its input"
                )
                self.out.line(f"-- the gateway restarted; the run {where}")
            case "input.staged":
                self.out.line(f"-- input staged for the current run: {data.get('input')}")
            case "input.queued":
                self.out.line(f"-- input queued as the next run: {data.get('input')}")
            case "agent.changed":
                self.out.line(f"-- handed off to {data.get('agent')}")
            case "run.completed":
                self.finish_run(run_id)
                final = data.get("final_output")
                final_text = final if isinstance(final, str) else compact_json(final)
                if final_text != self.last_message_text:
                    self.out.line(f"final answer: {final_text}")
                self.status("completed")
            case "run.failed":
                self.finish_run(run_id)
                error = data.get("error") or {}
                self.status(f"failed (error {error.get('code')}: {error.get('message')})")
            case "run.cancelled":
                self.finish_run(run_id)
                self.status("cancelled")
            case _:
                self.out.line(f"-- {event}: {compact_json(data)}")

    def complete_message(self, message_id: str, text: str) -> None:
        message = self.messages.pop(message_id, None)
        if message is None:
            message = self.begin_message(message_id, "agent")
        elif self.current_message != message_id:
            self.begin_message(message_id, message.agent)
            message.printed = ""
        if text.startswith(message.printed):
            self.out.write(text[len(message.printed) :])
        else:  # should not happen: deltas always add up to the text
            self.out.newline()
            self.out.write(f"{message.agent} (corrected): {text}")
        self.end_message()
        self.last_message_text = text

    def finish_run(self, run_id: str | None) -> None:
        if run_id:
            self.runs_seen.add(run_id)
            self.runs_finished.add(run_id)
        for message_id in list(self.messages):
            self.messages.pop(message_id)
        self.out.newline()
        self.current_message = None

    def _should_echo(self, text: str) -> bool:
        """Echo inputs the terminal did not show already (piped stdin, history, others)."""
        if text in self.sent_inputs:
            self.sent_inputs.remove(text)
            return not self.stdin_is_tty
        return True


async def run_chat(options: ChatOptions, stdout: TextIO, stderr: TextIO) -> int:
    app = ChatApp(
        options,
        out=(out := Output(stdout)),
        diag=Output(stderr, partner=out),
        stdin_is_tty=sys.stdin.isatty(),
    )
    return await app.main(StdinLines())
