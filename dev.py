#!/usr/bin/env python3
"""Bootstrap and run the project with nothing but Python 3.11+.

    python3 dev.py serve [flags]   create .venv if needed, then serve the demo gateway
    python3 dev.py test [args]     create .venv if needed, then run the whole test suite
                                   (with Node.js and npm present, it first installs the
                                   JavaScript client's dev dependencies, so its tests run too)
    python3 dev.py lint            ruff (lint + format check) and the layer rules (import-linter)

The virtual environment is rebuilt when pyproject.toml changes, so the two quick-start
commands keep working from a fresh clone and after every pull.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("GATEWAY_VENV", ROOT / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".installed"
# The JavaScript client package, and the frontend libraries the adapters are tested with.
JS_PACKAGES = (ROOT / "client_demo" / "js", ROOT / "tests" / "frontends" / "node")


def fingerprint() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()


def ensure_venv() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 (this file runs before any venv exists)
        sys.exit(f"Python 3.11+ is required (this is {sys.version.split()[0]})")
    if STAMP.exists() and STAMP.read_text() == fingerprint() and PYTHON.exists():
        return
    if not PYTHON.exists():
        print(f"creating virtual environment in {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    print("installing the project and its test dependencies", flush=True)
    pip = [str(PYTHON), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "install", "-e", f"{ROOT}[test]"], check=True)
    STAMP.write_text(fingerprint())


def ensure_js_packages() -> None:
    """`npm ci` in each JavaScript package whose lockfile changed. Without npm, or when it
    fails (offline), the tests that need it skip and say why; CI makes that a failure."""
    npm = shutil.which("npm")
    for package in JS_PACKAGES:
        lock = package / "package-lock.json"
        if npm is None or not lock.exists():
            continue
        stamp = package / "node_modules" / ".gateway-installed"
        digest = hashlib.sha256(lock.read_bytes()).hexdigest()
        if stamp.exists() and stamp.read_text() == digest:
            continue
        print(f"installing {package.relative_to(ROOT)}'s npm packages (npm ci)", flush=True)
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=package, check=False
        )
        if done.returncode == 0:
            stamp.write_text(digest)
        else:
            print(f"npm ci failed in {package.relative_to(ROOT)}: its tests will skip", flush=True)


def run(*args: str) -> int:
    return subprocess.call([str(PYTHON), *args], cwd=ROOT)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"serve", "test", "lint"}:
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    ensure_venv()
    if command == "serve":
        return run("-m", "gateway", "serve", *rest)
    if command == "test":
        ensure_js_packages()
        return run("-m", "pytest", *rest)
    status = run("-m", "ruff", "check", "gateway", "persistence", "client_demo", "tests", "bench")
    status |= run(
        "-m", "ruff", "format", "--check", "gateway", "persistence", "client_demo", "tests", "bench"
    )
    # The layer rules: pyproject.toml [tool.importlinter].
    status |= subprocess.call([str(BIN / "lint-imports"), "--no-cache"], cwd=ROOT)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
