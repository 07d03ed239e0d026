"""`serve --workers N`: N gateway processes on one port, started and kept running.

One asyncio process uses one core. The supervisor binds the port once and starts N worker
processes (`python -m gateway serve`, the same flags) that accept on the inherited socket, so
the kernel spreads connections over them. They are N gateway processes on one database like
any others (docs/operations.md "One process or several"): each has its own instance id,
`<instance id>/<n>`, kept when a worker is started again, so a worker that replaces a dead one
takes its runs over at once; in development mode they share one signing secret, so a token
from one is good on all. A worker that dies is started again (unless it keeps dying right after
its start); SIGTERM and SIGINT are passed on to every worker, which shut down gracefully
(handing their runs over), and the supervisor exits once they all have.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from types import FrameType

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


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen[bytes]
    started_at: float
    early_exits: int = 0


class Supervisor:
    def __init__(self, settings: Settings, argv: list[str]) -> None:
        self._settings = settings
        # The worker's own command line: every flag but those set for it here.
        self._argv = _without(argv, SET_FOR_WORKERS)
        self._socket = socket.create_server(
            (settings.host, settings.port), backlog=settings.backlog
        )
        self._socket.set_inheritable(True)
        self.port = int(self._socket.getsockname()[1])
        # Resolved once: with --port 0 the default id names the port actually bound.
        self._instance_base = settings.instance_id or f"{socket.gethostname()}:{self.port}"
        self._env = {
            **os.environ,
            "GATEWAY_WORKERS": "1",
            "GATEWAY_LISTEN_FD": str(self._socket.fileno()),
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
            self._start(index)
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
        self._socket.close()
        return 1 if failed else 0

    def _wait_ready(self) -> None:
        """Until a worker answers `/readyz` (connections wait in the socket's backlog until
        then), so "running" is said once the gateway serves."""
        host = "127.0.0.1" if self._settings.host in {"0.0.0.0", ""} else self._settings.host
        url = f"http://{host}:{self.port}/readyz"
        deadline = time.monotonic() + READY_WITHIN_S
        while time.monotonic() < deadline and not self._stopping:
            if any(w.process.poll() is not None for w in self._workers.values()):
                return  # the loop in `run` reports it
            try:
                with urllib.request.urlopen(url, timeout=1.0) as response:
                    if response.status == 200:
                        return
            except (OSError, ValueError):
                pass
            time.sleep(POLL_S)

    def _start(self, index: int, early_exits: int = 0) -> None:
        env = {**self._env, "GATEWAY_INSTANCE_ID": f"{self._instance_base}/{index}"}
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", *self._argv],
            env=env,
            pass_fds=(self._socket.fileno(),),
        )
        self._workers[index] = _Worker(index, process, time.monotonic(), early_exits)
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
