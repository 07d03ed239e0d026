"""The terminal client (`python -m client_demo`) against real gateway subprocesses.

Clients and gateways are real processes: the chat client reads its input from stdin and prints
the conversation on stdout, the review client decides with `--auto`. Development tokens are used
(`GATEWAY_SECRET` empty), so the clients fetch their own tokens, also after a gateway restart.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.gateway import ROOT, GatewayProcess, spawn_gateway

TIMEOUT = 90.0  # slow CI: cold subprocess start-ups and a gateway restart
# Development tokens (an empty secret counts as unset); frequent server pings, which the
# clients must answer with pongs without disturbing their output.
DEV_ENV = {"GATEWAY_SECRET": "", "GATEWAY_HEARTBEAT_S": "0.2"}


class ClientProcess:
    """`python -m client_demo ...` with stdout/stderr collected by reader threads."""

    def __init__(
        self, args: list[str], stdin_text: str | None, *, keep_stdin_open: bool = False
    ) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "utf-8"}
        env.pop("GATEWAY_TOKEN", None)
        env.pop("GATEWAY_URL", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "client_demo", *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )
        self._out: list[str] = []
        self._err: list[str] = []
        self._lock = threading.Lock()
        self._readers = [
            threading.Thread(target=self._pump, args=(self.process.stdout, self._out), daemon=True),
            threading.Thread(target=self._pump, args=(self.process.stderr, self._err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        if stdin_text is not None:
            self.send(stdin_text)
            if not keep_stdin_open:
                self.close_stdin()

    def send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text)
        self.process.stdin.flush()

    def close_stdin(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()  # end of input: the client exits once the run ends

    def _pump(self, stream: Any, sink: list[str]) -> None:
        while True:
            chunk = stream.read(1)  # text as it arrives: the client flushes every delta
            if not chunk:
                return
            with self._lock:
                sink.append(chunk)

    @property
    def stdout(self) -> str:
        with self._lock:
            return "".join(self._out)

    @property
    def stderr(self) -> str:
        with self._lock:
            return "".join(self._err)

    def wait_output(
        self, predicate: Callable[[str], bool], timeout: float = TIMEOUT, *, stderr: bool = False
    ) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.stderr if stderr else self.stdout
            if predicate(out):
                return out
            if self.process.poll() is not None:
                break
            time.sleep(0.01)
        raise AssertionError(f"output not seen (rc={self.process.poll()}):\n{self.describe()}")

    def wait(self, timeout: float = TIMEOUT) -> int:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"client did not exit:\n{self.describe()}") from None
        for reader in self._readers:
            reader.join(5)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def describe(self) -> str:
        return f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"


@pytest.fixture
def procs() -> Iterator[list[Any]]:
    """Every gateway and client started by a test; all killed at teardown."""
    started: list[Any] = []
    yield started
    for proc in reversed(started):
        proc.kill()


def http_url(gw: GatewayProcess) -> str:
    return f"http://127.0.0.1:{gw.port}"


def client(
    procs: list[Any], *args: str, stdin_text: str | None = None, keep_stdin_open: bool = False
) -> ClientProcess:
    proc = ClientProcess(list(args), stdin_text, keep_stdin_open=keep_stdin_open)
    procs.append(proc)
    return proc


def thread_id_of(chat: ClientProcess) -> str:
    match = re.search(r"-- thread (t_\w+)", chat.stderr)
    assert match, chat.describe()
    return match.group(1)


def stored_events(gw: GatewayProcess, thread_id: str) -> list[dict[str, Any]]:
    with httpx.Client(base_url=http_url(gw), timeout=30) as http:
        token = http.post(
            "/v1/dev/token", json={"user": "alice", "tenant": "demo", "roles": ["user"]}
        ).json()["token"]
        response = http.get(
            f"/v1/threads/{thread_id}/events",
            params={"limit": 1000},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert response.status_code == 200, response.text
    return list(response.json()["events"])


def last_message(stdout: str) -> str:
    """What follows the last `assistant: ` prefix: the final message and the lines after it."""
    assert "assistant: " in stdout, stdout
    return stdout.rsplit("assistant: ", 1)[1]


def test_chat_and_review_clients_complete_a_refund(tmp_path: Path, procs: list[Any]) -> None:
    gw = spawn_gateway(tmp_path, env=DEV_ENV)
    procs.append(gw)
    url = http_url(gw)
    chat = client(procs, "chat", "--url", url, stdin_text="refund order 42 for 30 dollars\n")
    chat.wait_output(lambda out: "-- status: waiting_for_review" in out)
    review = client(procs, "review", "--url", url, "--auto", "approve", "--once")

    assert review.wait() == 0, review.describe()
    assert chat.wait() == 0, chat.describe()

    approval = re.search(r"approval (ap_\w+): issue_refund (\{.*\})", review.stdout)
    assert approval, review.describe()
    assert approval.group(2) == '{"order_id": 42, "amount": 30.0}'
    assert f"-- approved {approval.group(1)} (issue_refund)" in review.stdout
    assert "as bob (tenant demo, roles reviewer)" in review.stderr

    out = chat.stdout
    assert out.startswith("you: refund order 42 for 30 dollars\n-- status: running\n"), out
    assert 'waiting for a reviewer: issue_refund {"order_id": 42, "amount": 30.0}' in out
    assert '-- tool call: issue_refund {"order_id": 42, "amount": 30.0}' in out
    assert "-- approved by bob" in out
    assert "-- tool output: issue_refund: Refund of 30.00 USD issued for order 42" in out
    # stdout ends with the streamed final answer, then the completion line
    final = last_message(out).removesuffix("\n-- status: completed\n")
    assert final != last_message(out), out
    assert "Refund of 30.00 USD issued for order 42" in final
    assert out.index("-- approved by bob") < out.rindex("assistant: ")
    assert out.count("-- status: completed") == 1
    assert "error" not in chat.stderr, chat.stderr

    events = stored_events(gw, thread_id_of(chat))
    completed = [e for e in events if e["event"] == "run.completed"]
    assert [e["data"]["final_output"] for e in completed] == [final]
    # every event printed once: one line per tool call, approval and status change
    assert out.count("-- waiting for a reviewer") == 1
    assert out.count("assistant: ") == sum(e["event"] == "message.started" for e in events)


def test_chat_client_reconnects_across_a_gateway_crash(tmp_path: Path, procs: list[Any]) -> None:
    env = {**DEV_ENV, "GATEWAY_DEMO_DELAY_MS": "20"}
    first = spawn_gateway(tmp_path, env=env)
    procs.append(first)
    chat = client(
        procs,
        "chat",
        "--url",
        http_url(first),
        "--max-backoff",
        "1",
        stdin_text="tell me a story about a lighthouse\n",
    )

    def story_streaming(out: str) -> bool:
        return "assistant: " in out and len(out.split("assistant: ", 1)[1].split()) >= 10

    at_kill = chat.wait_output(story_streaming)
    first.kill()  # SIGKILL mid-stream: the open message is aborted on recovery
    assert "-- status: completed" not in at_kill, "the story ended before the kill"
    thread_id = thread_id_of(chat)

    # Same port and database; the new process has a new development secret, so the client
    # has to fetch a new token too.
    second = spawn_gateway(tmp_path, env=env, args=["--port", str(first.port)])
    procs.append(second)
    assert second.port == first.port
    assert chat.wait(120) == 0, chat.describe() + second.log()[-4000:]

    out = chat.stdout
    assert "-- reconnected to" in chat.stderr, chat.describe()
    events = stored_events(second, thread_id)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    names = [e["event"] for e in events]
    assert names.count("run.completed") == 1 and names[-1] == "run.completed", names
    started = [e["data"]["message_id"] for e in events if e["event"] == "message.started"]
    aborted = [e["data"]["message_id"] for e in events if e["event"] == "message.aborted"]
    completed = {
        e["data"]["message_id"]: e["data"]["text"]
        for e in events
        if e["event"] == "message.completed"
    }
    assert len(started) == 2 and aborted == [started[0]], names
    assert list(completed) == [started[1]]

    # Each message is printed exactly once (nothing repeated after the reconnect) ...
    segments = out.split("assistant: ")
    assert len(segments) == 1 + len(started), out
    # ... the aborted one with every stored delta (also those the first process stored but
    # never delivered), then marked as interrupted ...
    partial = "".join(
        e["data"]["delta"]
        for e in events
        if e["event"] == "message.delta" and e["data"]["message_id"] == started[0]
    )
    assert segments[1] == (
        f"{partial}\n[interrupted]\n-- the gateway restarted; the run starts again from its input\n"
    ), out
    assert partial.split()[:10] == at_kill.split("assistant: ", 1)[1].split()[:10]
    # ... and the regenerated story exactly as the server stored it.
    story = completed[started[1]]
    assert len(story.split()) >= 200
    assert segments[2] == story + "\n-- status: completed\n", out
    assert out.startswith("you: tell me a story about a lighthouse\n-- status: running\n")


# Short-lived development tokens, and no leeway: the gateway ends a connection right at `exp`.
SHORT_TTL_S = 6
EXPIRY_ENV = {**DEV_ENV, "GATEWAY_JWT_LEEWAY_S": "0", "GATEWAY_DEMO_DELAY_MS": "10"}


def test_chat_client_renews_its_development_token_on_the_open_connection(
    tmp_path: Path, procs: list[Any]
) -> None:
    gw = spawn_gateway(tmp_path, env=EXPIRY_ENV)
    procs.append(gw)
    chat = client(
        procs,
        "chat",
        "--url",
        http_url(gw),
        "--dev-token-ttl",
        str(SHORT_TTL_S),
        stdin_text="hello before the expiry\n",
        keep_stdin_open=True,
    )
    chat.wait_output(lambda err: "-- connected to" in err, stderr=True)
    # The first token was fetched before that line appeared, so it expires within SHORT_TTL_S
    # of now: the gateway would have closed the connection by then without a renewal.
    first_expiry = time.monotonic() + SHORT_TTL_S
    chat.wait_output(lambda out: out.count("-- status: completed") == 1)
    time.sleep(max(0.0, first_expiry + 1.0 - time.monotonic()))
    assert chat.process.poll() is None, chat.describe()
    assert "-- token renewed (valid until " in chat.stderr, chat.describe()

    # A run started after the first token's expiry streams on the same connection, through
    # more renewals.
    chat.send("tell me a story about a clock\n")
    chat.wait_output(lambda out: out.count("-- status: completed") == 2)
    chat.close_stdin()
    assert chat.wait() == 0, chat.describe()

    err = chat.stderr
    assert err.count("-- connected to") == 1, err
    assert "reconnect" not in err and "connection lost" not in err, err
    assert "error" not in err and "could not" not in err, err
    assert err.count("-- token renewed") >= 2, err
    events = stored_events(gw, thread_id_of(chat))
    texts = [e["data"]["text"] for e in events if e["event"] == "message.completed"]
    assert len(texts) == 2 and len(texts[1].split()) >= 200
    assert chat.stdout.endswith(f"assistant: {texts[1]}\n-- status: completed\n"), chat.stdout


def test_chat_client_warns_before_a_given_token_expires_then_exits(
    tmp_path: Path, procs: list[Any]
) -> None:
    gw = spawn_gateway(tmp_path, env=EXPIRY_ENV)
    procs.append(gw)
    with httpx.Client(base_url=http_url(gw), timeout=30) as http:
        response = http.post("/v1/dev/token", json={"user": "alice", "ttl_s": SHORT_TTL_S})
    assert response.status_code == 200, response.text
    started = time.monotonic()
    chat = client(
        procs,
        "chat",
        "--url",
        http_url(gw),
        "--token",
        response.json()["token"],
        stdin_text="hello\n",
        keep_stdin_open=True,  # the client would otherwise exit once the run is over
    )
    chat.wait_output(lambda out: "-- status: completed" in out)
    chat.wait_output(lambda err: "-- warning: the access token expires at" in err, stderr=True)
    assert chat.process.poll() is None, "warned only after the session ended"

    assert chat.wait() == 1, chat.describe()
    assert time.monotonic() - started < SHORT_TTL_S + 10
    err = chat.stderr
    assert "the access token expired at" in err, err
    assert "start the client again with a fresh token (--token or GATEWAY_TOKEN)" in err, err
    assert "reconnect" not in err and "token renewed" not in err, err
    assert "error unauthorized" not in err, err  # said in words fit for a user instead
