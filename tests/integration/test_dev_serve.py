"""`python3 dev.py serve`: a signal sent to it reaches the gateway, which stops and frees its
port (a process manager stops the demo with SIGTERM)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.gateway import ROOT, TEST_SECRET


def test_sigterm_to_dev_serve_stops_the_gateway_and_frees_the_port(tmp_path: Path) -> None:
    log_path = tmp_path / "serve.log"
    env = {
        **os.environ,
        "GATEWAY_DATABASE_URL": f"sqlite:///{tmp_path / 'gateway.db'}",
        "GATEWAY_SECRET": TEST_SECRET,
        "GATEWAY_INSTANCE_ID": "dev-serve",
    }
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "dev.py"), "serve", "--port", "0", "--no-demo"],
            cwd=tmp_path,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            found = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", log_path.read_text())
            port = int(found.group(1)) if found else None
            assert process.poll() is None, log_path.read_text()
            time.sleep(0.1)
        assert port is not None, log_path.read_text()
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        # Nothing listens on the port any more: the gateway stopped along with dev.py.
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) != 0:
                    break
            assert time.monotonic() < deadline, "the gateway outlived dev.py and holds the port"
            time.sleep(0.1)
        assert "Shutting down" in log_path.read_text() or "Finished server process" in (
            log_path.read_text()
        )
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
