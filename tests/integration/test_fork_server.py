"""The forked `python -m gateway` processes of tests/support/fork_server.py behave as fresh
interpreters would for what tests rely on: exit status and output, signals, and no process
left behind once the server closes."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support.fork_server import ForkServer, GatewayCommand, run_gateway_command
from tests.support.gateway import ROOT, spawn_gateway


def test_a_command_s_status_and_output_are_its_own(tmp_path: Path) -> None:
    env = {**os.environ, "GATEWAY_DATABASE_URL": f"sqlite:///{tmp_path / 'gateway.db'}"}
    behind = run_gateway_command(["migrate", "--current"], env=env, cwd=ROOT)
    assert behind.returncode == 1, behind
    assert "revision (none)" in behind.stdout and behind.stderr == ""
    refused = run_gateway_command(["runs", "list"], env=env, cwd=ROOT)
    assert refused.returncode == 6 and "schema_not_current" in refused.stderr, refused
    assert refused.stdout == ""
    # The child's environment is the one asked for, not the server's.
    bad_port = run_gateway_command(["serve"], env={**env, "GATEWAY_PORT": "x"}, cwd=ROOT)
    assert bad_port.returncode != 0 and "GATEWAY_PORT" in bad_port.stderr, bad_port


def test_signals_reach_the_child_and_its_status_says_so(tmp_path: Path) -> None:
    killed = spawn_gateway(tmp_path)
    terminated = spawn_gateway(tmp_path, env={"GATEWAY_INSTANCE_ID": "second"})
    assert killed.process.pid != terminated.process.pid != os.getpid()
    killed.kill()
    assert killed.process.returncode == -signal.SIGKILL
    terminated.process.send_signal(signal.SIGTERM)
    # uvicorn shuts down, then ends by the signal it was given (as a fresh interpreter does).
    assert terminated.process.wait(30) == -signal.SIGTERM
    assert "Application shutdown complete" in terminated.log()


def test_closing_the_server_ends_what_still_runs(tmp_path: Path) -> None:
    server = ForkServer()
    env = {
        **os.environ,
        "GATEWAY_DATABASE_URL": f"sqlite:///{tmp_path / 'gateway.db'}",
        "GATEWAY_SECRET": "s" * 64,
    }
    process = server.start(GatewayCommand(["serve", "--port", "0"], env, ROOT, tmp_path / "log"))
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(0.5)
    server.close()
    assert process.wait(10) == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(process.pid, 0)
