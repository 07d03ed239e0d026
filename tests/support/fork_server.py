"""The tests' `python -m gateway` processes, forked from one interpreter that imported the
gateway once, instead of each importing it again.

A fresh `python -m gateway serve` spends ~2.3 s of CPU importing the Agents SDK, the OpenAI
types and the gateway before it listens, and the suite starts a few hundred of them (each kill -9
of a soak restarts one): on a 2-core machine that import was the largest single cost of the
whole run. Here each pytest worker starts one server (`python -m tests.support.fork_server`)
that imports all that, then forks a child per command. The child is an ordinary process: it
sets the command's environment, working directory, descriptor limit and output files, then
runs `gateway.__main__.main` with the command's arguments, as `python -m gateway` would, and
exits with its status. Tests signal, SIGKILL and wait for it by its pid; the server reaps it
and hands its exit status back through a file.

`GATEWAY_TEST_FORK=0` runs every command as a fresh interpreter instead (to rule the fork out
when a start-up behaves oddly). Tests of the interpreter's own start-up (`dev.py serve`, the
container image, a worker's re-exec) never come here.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import resource
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any, Protocol

# What a gateway process imports before it serves, or an operator command before it answers:
# imported once by the server, so that a forked child finds them loaded.
PRELOADED = (
    "gateway.__main__",
    "gateway.app",
    "gateway.operator.commands",
    "gateway.observability.log_config",
    "gateway.server.config",
    "gateway.server.workers",
    "persistence.backends",
    "persistence.schema",
    "tests.support.agents",
)
ENABLED = os.environ.get("GATEWAY_TEST_FORK", "1") != "0"


class Process(Protocol):
    """What tests use of a gateway process, whether forked here or a `subprocess.Popen`."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | Any: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


@dataclass
class ForkedProcess:
    """A child of the fork server, used like `subprocess.Popen`: its exit status (negative
    for a signal, as Popen has it) appears once the server reaps it."""

    pid: int
    args: list[str]
    status_path: Path
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self.status_path.exists():
            self.returncode = int(self.status_path.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.01)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


@dataclass(frozen=True)
class GatewayCommand:
    """`python -m gateway ARGV` in `cwd` with exactly `env`, its output appended to `stdout`
    (and `stderr`, or `stdout` when None); `max_open_files`: its descriptor limit."""

    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: Path
    stdout: Path
    stderr: Path | None = None
    max_open_files: int | None = None

    @property
    def args(self) -> list[str]:
        return ["python", "-m", "gateway", *self.argv]


class ForkServer:
    """This pytest worker's fork server, started on first use; closing it SIGKILLs the
    children still running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server: subprocess.Popen[bytes] | None = None
        self._count = 0

    def start(self, command: GatewayCommand) -> ForkedProcess:
        """The command as a forked child."""
        with self._lock:
            server = self._started()
            self._count += 1
            status_path = command.stdout.with_name(f"{command.stdout.name}.{self._count}.status")
            request = {
                "argv": list(command.argv),
                "env": dict(command.env),
                "cwd": str(command.cwd),
                "stdout": str(command.stdout),
                "stderr": str(command.stderr or command.stdout),
                "status": str(status_path),
                "max_open_files": command.max_open_files,
            }
            assert server.stdin is not None and server.stdout is not None
            server.stdin.write(json.dumps(request).encode() + b"\n")
            server.stdin.flush()
            reply = server.stdout.readline()
            if not reply:
                raise RuntimeError("the fork server exited")
            return ForkedProcess(int(reply), command.args, status_path)

    def _started(self) -> subprocess.Popen[bytes]:
        if self._server is None or self._server.poll() is not None:
            self._server = subprocess.Popen(
                [sys.executable, "-m", "tests.support.fork_server"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=Path(__file__).resolve().parents[2],
            )
        return self._server

    def close(self) -> None:
        with self._lock:
            if self._server is not None and self._server.poll() is None:
                assert self._server.stdin is not None
                self._server.stdin.close()  # end of requests: it kills its children and exits
                try:
                    self._server.wait(10)
                except subprocess.TimeoutExpired:
                    self._server.kill()
            self._server = None


@functools.cache
def fork_server() -> ForkServer:
    """This process's fork server: one per pytest worker, closed at the end of its session
    (tests/conftest.py)."""
    return ForkServer()


def gateway_command(command: GatewayCommand) -> Process:
    """The command started, forked (or, under GATEWAY_TEST_FORK=0, a fresh interpreter)."""
    if ENABLED:
        return fork_server().start(command)
    limit = command.max_open_files
    with command.stdout.open("a") as out, (command.stderr or command.stdout).open("a") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "gateway", *command.argv],
            cwd=command.cwd,
            env=dict(command.env),
            stdout=out,
            stderr=err,
            preexec_fn=None if limit is None else partial(_limit_files, limit),
        )


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str


def run_gateway_command(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float = 120.0
) -> Finished:
    """`python -m gateway ARGV` run to its end (as `gateway_command` starts it), with its
    output: `subprocess.run(..., capture_output=True, text=True)` for the gateway's commands."""
    with tempfile.TemporaryDirectory() as folder:
        stdout, stderr = Path(folder) / "stdout", Path(folder) / "stderr"
        process = gateway_command(GatewayCommand(argv, env, cwd, stdout, stderr))
        try:
            status = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        return Finished(status, stdout.read_text(), stderr.read_text())


def _limit_files(count: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))


# --- the server's side: `python -m tests.support.fork_server` ---------------------------------


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """Fork a child per request line, reply with its pid, and write each child's exit status
    to its status file as it ends. At end of input: SIGKILL what still runs, and return."""
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written
    children: dict[int, Path] = {}
    while True:
        ready, _, _ = select.select([requests, woken], [], [])
        if woken in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(woken, 512)
        reap(children, block=False)
        if requests in ready:
            line = requests.readline()
            if not line:
                break
            request = json.loads(line)
            replies.flush()
            pid = os.fork()
            if pid == 0:
                os.close(woken)
                os.close(wake)
                become(request)
            children[pid] = Path(request["status"])
            replies.write(f"{pid}\n".encode())
            replies.flush()
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    reap(children, block=True)


def reap(children: dict[int, Path], *, block: bool) -> None:
    for pid in list(children):
        try:
            done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 255 << 8
        if done:
            path = children.pop(pid)
            partial = path.with_name(path.name + ".partial")
            partial.write_text(str(os.waitstatus_to_exitcode(status)))
            partial.rename(path)


def become(request: dict[str, Any]) -> None:
    """In the forked child: take the command's surroundings, run it, exit with its status."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if request["max_open_files"] is not None:
            _limit_files(request["max_open_files"])
        redirect(request["stdout"], request["stderr"])
        code = run(request["argv"])
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def redirect(stdout: str, stderr: str) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)


def run(argv: list[str]) -> int:
    """`python -m gateway ARGV`'s exit status, with the interpreter's exit handlers run as its
    own shutdown would."""
    from gateway.__main__ import main

    sys.argv = [str(Path(sys.modules["gateway.__main__"].__file__ or "gateway")), *argv]
    try:
        code: object = main(argv)
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def preload() -> None:
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)


if __name__ == "__main__":
    preload()
    serve(sys.stdin.buffer, sys.stdout.buffer)
