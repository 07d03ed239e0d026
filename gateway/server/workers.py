"""`serve --workers N`: N gateway processes on one port, started and kept running.

One asyncio process uses one core. The supervisor binds the port and starts N worker processes
(`python -m gateway serve`, the same flags), each accepting on a listening socket of its own
that it inherits. On Linux the N sockets form the port's SO_REUSEPORT group, and the kernel
hashes each new connection to one of them: a burst of connections is shared by the workers.
(On one shared socket, the worker whose event loop wakes first accepts every connection waiting
at that moment: a burst of 100 went whole to one of two workers.) The supervisor keeps every
socket open, so connections that arrive for a worker being started again wait in its backlog
instead of being refused. Elsewhere the workers share one socket. They are N gateway processes
on one database like any others (docs/operations.md "One process or several"): each has its own
instance id, `<instance id>/<n>`, kept when a worker is started again, so a worker that replaces
a dead one takes its runs over at once; in development mode they share one signing secret, so a
token from one is good on all. A worker that dies is started again (unless it keeps dying right
after its start); SIGTERM and SIGINT are passed on to every worker, which shut down gracefully
(handing their runs over), and the supervisor exits once they all have.
"""

from __future__ import annotations

import logging
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from types import FrameType

import uvicorn

from gateway.observability.metrics import MULTIPROC_ENV, worker_died
from gateway.settings import Settings
from gateway.settings_cli import flags

log = logging.getLogger("gateway.workers")

# The flags the supervisor sets for each worker, through its environment instead.
SET_FOR_WORKERS = flags(("workers", "instance_id", "host", "port"))
# A worker that exits within this long of its start, this many times in a row, is not started
# again: it cannot start (bad configuration, database refused), and the supervisor gives up.
EARLY_EXIT_S = 5.0
EARLY_EXITS = 5
# How long the workers get to stop gracefully (runs reach a turn boundary within 10 s).
STOP_GRACE_S = 30.0
POLL_S = 0.2
ORPHAN_SIGNAL_EVERY_S = 2.0
READY_WITHIN_S = 60.0
# Linux spreads a port's connections over its SO_REUSEPORT sockets; BSD and macOS hand them all
# to one, and Windows has no such option.
BALANCED_REUSE_PORT = sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen[bytes]
    started_at: float
    early_exits: int = 0
    # The read end of the pipe the worker writes to once it serves (first start only).
    ready_pipe: int | None = None


class Supervisor:
    def __init__(self, settings: Settings, argv: list[str]) -> None:
        self._settings = settings
        # The worker's own command line: every flag but those set for it here.
        self._argv = _without(argv, SET_FOR_WORKERS)
        self._sockets = listening_sockets(
            settings.host, settings.port, settings.backlog, settings.workers
        )
        self.port = int(self._sockets[0].getsockname()[1])
        # Resolved once: with --port 0 the default id names the port actually bound.
        self._instance_base = settings.instance_id or f"{socket.gethostname()}:{self.port}"
        self._env = {
            **os.environ,
            "GATEWAY_WORKERS": "1",
            "GATEWAY_SUPERVISOR_PID": str(os.getpid()),
            "GATEWAY_HOST": settings.host,
            "GATEWAY_PORT": str(self.port),
        }
        if settings.dev_mode:
            self._env["GATEWAY_DEV_SECRET"] = secrets.token_urlsafe(48)
        # prometheus-client's multiprocess mode: every worker writes its metrics to files of
        # one fresh directory, and a scrape, whichever worker answers, adds them all up. Fresh,
        # so no earlier gateway's counts are added; removed when the supervisor exits.
        self._metrics_dir: str | None = None
        if settings.metrics:
            self._metrics_dir = tempfile.mkdtemp(prefix="gateway-metrics-")
            self._env[MULTIPROC_ENV] = self._metrics_dir
        self._workers: dict[int, _Worker] = {}
        self._stopping = False

    def run(self) -> int:
        try:
            return self._run()
        finally:
            if self._metrics_dir is not None:
                shutil.rmtree(self._metrics_dir, ignore_errors=True)

    def _run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._stop)
        for index in range(self._settings.workers):
            self._start(index, report_ready=True)
        self._wait_ready()
        log.info(
            "Uvicorn running on http://%s:%d (%d worker processes; press CTRL+C to quit)",
            self._settings.host,
            self.port,
            self._settings.workers,
        )
        failed = False
        deadline: float | None = None
        while self._workers:
            time.sleep(POLL_S)
            if self._stopping and deadline is None:
                deadline = time.monotonic() + STOP_GRACE_S
            for index, worker in list(self._workers.items()):
                code = worker.process.poll()
                if code is None:
                    continue
                del self._workers[index]
                if self._metrics_dir is not None:
                    worker_died(self._metrics_dir, worker.process.pid)
                if self._stopping:
                    continue
                if not self._restart(worker, code):
                    failed = True
                    self._stop(signal.SIGTERM, None)
            if deadline is not None and time.monotonic() > deadline:
                for worker in self._workers.values():
                    log.warning("worker %d did not stop in time; killing it", worker.index)
                    worker.process.kill()
                deadline = float("inf")
        for listener in set(self._sockets):
            listener.close()
        return 1 if failed else 0

    def _wait_ready(self) -> None:
        """Until every worker serves (connections wait in its socket's backlog until then),
        so "running" is said once each connection is accepted at once. Each worker writes to
        its pipe when it serves; one that exits first closes it, and the loop in `run` reports
        that."""
        pending = {w.ready_pipe for w in self._workers.values() if w.ready_pipe is not None}
        deadline = time.monotonic() + READY_WITHIN_S
        while pending and not self._stopping and time.monotonic() < deadline:
            try:
                readable, _, _ = select.select(list(pending), [], [], POLL_S)
            except InterruptedError:  # a signal: the loop looks at `_stopping` again
                continue
            for pipe in readable:
                os.read(pipe, 1)
                pending.discard(pipe)
        for worker in self._workers.values():
            if worker.ready_pipe is not None:
                os.close(worker.ready_pipe)
                worker.ready_pipe = None

    def _start(self, index: int, early_exits: int = 0, *, report_ready: bool = False) -> None:
        listener = self._sockets[index]
        env = {
            **self._env,
            "GATEWAY_INSTANCE_ID": f"{self._instance_base}/{index}",
            "GATEWAY_LISTEN_FD": str(listener.fileno()),
        }
        pass_fds = [listener.fileno()]
        ready_pipe: int | None = None
        if report_ready:
            ready_pipe, ready_end = os.pipe()
            env["GATEWAY_READY_FD"] = str(ready_end)
            pass_fds.append(ready_end)
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", *self._argv],
                env=env,
                pass_fds=pass_fds,
            )
        finally:
            if ready_pipe is not None:
                os.close(ready_end)
        self._workers[index] = _Worker(index, process, time.monotonic(), early_exits, ready_pipe)
        log.info("worker %d started (pid %d)", index, process.pid)

    def _restart(self, worker: _Worker, code: int) -> bool:
        how = f"signal {-code}" if code < 0 else f"status {code}"
        early = time.monotonic() - worker.started_at < EARLY_EXIT_S
        early_exits = worker.early_exits + 1 if early else 0
        if early_exits >= EARLY_EXITS:
            log.error(
                "worker %d exited with %s %d times right after starting; stopping",
                worker.index,
                how,
                early_exits,
            )
            return False
        log.warning("worker %d exited with %s; starting it again", worker.index, how)
        self._start(worker.index, early_exits)
        return True

    def _stop(self, signum: int, _frame: FrameType | None) -> None:
        if self._stopping:
            return
        self._stopping = True
        log.info("stopping %d worker(s)", len(self._workers))
        for worker in self._workers.values():
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)


def listening_sockets(host: str, port: int, backlog: int, workers: int) -> list[socket.socket]:
    """The worker `n`'s listening socket at index `n`: on Linux one socket each, bound to the
    same port with SO_REUSEPORT (the first binds `port`, 0 for any free one; the others join
    it), elsewhere (where SO_REUSEPORT does not balance) one socket for all."""
    first = socket.create_server((host, port), backlog=backlog, reuse_port=BALANCED_REUSE_PORT)
    port = int(first.getsockname()[1])
    sockets = [first]
    for _ in range(1, workers):
        if not BALANCED_REUSE_PORT:
            sockets.append(first)
            continue
        try:
            sockets.append(socket.create_server((host, port), backlog=backlog, reuse_port=True))
        except OSError:
            for listener in sockets:
                listener.close()
            raise
    for listener in sockets:
        listener.set_inheritable(True)
    return sockets


class WorkerServer(uvicorn.Server):
    """A worker's server: writes to `ready_fd` (and closes it) once it serves, which its
    supervisor waits for before it says the gateway runs."""

    def __init__(self, config: uvicorn.Config, ready_fd: int | None) -> None:
        super().__init__(config)
        self._ready_fd = ready_fd

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self._ready_fd is not None and self.started:
            try:
                os.write(self._ready_fd, b"1")
            except OSError:  # the supervisor is gone: `stop_with_supervisor` stops this one
                pass
            os.close(self._ready_fd)
            self._ready_fd = None


def stop_with_supervisor(supervisor: int) -> None:
    """In a worker: shut down gracefully (SIGTERM to itself) if the supervisor (pid
    `supervisor`) goes away, so no worker outlives it (a supervisor killed with SIGKILL cannot
    tell them). The pid comes from the supervisor itself: one that died while this worker was
    starting has already left it to another parent, which `os.getppid()` here would name."""

    def watch() -> None:
        while os.getppid() == supervisor:
            time.sleep(1.0)
        log.warning("the supervisor (pid %d) is gone; stopping", supervisor)
        # Again while the process lives: a signal that lands before the server has installed
        # its handler (the supervisor died during start-up) is not acted on. Past the grace,
        # the process ends without one.
        for _ in range(int(STOP_GRACE_S / ORPHAN_SIGNAL_EVERY_S)):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(ORPHAN_SIGNAL_EVERY_S)
        os._exit(1)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()


def _without(argv: list[str], flags: frozenset[str]) -> list[str]:
    """`argv` without `flags` and their values (`--flag value` and `--flag=value`)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif arg.split("=", 1)[0] not in flags:
            kept.append(arg)
    return kept
