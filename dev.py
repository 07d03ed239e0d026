#!/usr/bin/env python3
"""Bootstrap and run the project with nothing but Python 3.11+.

    python3 dev.py serve [flags]   create .venv if needed, then serve the demo gateway
                                   (with Node.js and npm present, it first builds the useChat
                                   example app it serves at /examples/ai-sdk/)
    python3 dev.py test [args]     create .venv if needed, then run the whole test suite
                                   (with Node.js and npm present, it first installs the
                                   JavaScript client's dev dependencies, so its tests run too;
                                   not for a selection without JavaScript tests, e.g. tests/unit)
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
# The useChat example app, which the demo gateway serves from its dist/ at /examples/ai-sdk/,
# and the files its build reads: a change to any of them rebuilds it.
EXAMPLE = ROOT / "client_demo" / "examples" / "ai-sdk"
EXAMPLE_SOURCES = ("app.jsx", "app.css", "index.html", "build.mjs", "package-lock.json")
# The JavaScript client package, the frontend libraries the adapters are tested with, and the
# example app's build dependencies.
JS_PACKAGES = (ROOT / "client_demo" / "js", ROOT / "tests" / "frontends" / "node", EXAMPLE)
# The tests that run Node.js or the example app: `dev.py test` installs the packages above
# only when the tests it runs include one of them.
JS_TESTS = (
    "tests/frontends",
    "tests/browser",
    "tests/integration/test_js_client.py",
    "tests/integration/test_reasoning_and_usage.py",
)


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


def lock_digest(package: Path) -> str:
    return hashlib.sha256((package / "package-lock.json").read_bytes()).hexdigest()


def installed(package: Path) -> bool:
    """Whether `npm ci` installed exactly the package's current lockfile."""
    stamp = package / "node_modules" / ".gateway-installed"
    return stamp.exists() and stamp.read_text() == lock_digest(package)


def ensure_js_packages(packages: tuple[Path, ...] = JS_PACKAGES) -> None:
    """`npm ci` in each JavaScript package whose lockfile changed. Without npm, or when it
    fails (offline), the tests that need it skip and say why; CI makes that a failure."""
    npm = shutil.which("npm")
    for package in packages:
        lock = package / "package-lock.json"
        if npm is None or not lock.exists():
            continue
        stamp = package / "node_modules" / ".gateway-installed"
        digest = lock_digest(package)
        if installed(package):
            continue
        print(f"installing {package.relative_to(ROOT)}'s npm packages (npm ci)", flush=True)
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=package, check=False
        )
        if done.returncode == 0:
            stamp.write_text(digest)
        else:
            print(f"npm ci failed in {package.relative_to(ROOT)}: its tests will skip", flush=True)


def ensure_example() -> None:
    """Build the useChat example into its dist/ when a source or the lockfile changed. Without
    Node.js, or when its install or build fails, the gateway serves no example, saying so here
    once; its browser test skips (a failure under CI)."""
    node = shutil.which("node")
    dist = EXAMPLE / "dist"
    if node is None or not installed(EXAMPLE):
        # A dist/ left from an older lockfile would serve what the pins no longer say.
        shutil.rmtree(dist, ignore_errors=True)
        print(
            "the useChat example is not served at /examples/ai-sdk/: it needs Node.js and npm",
            flush=True,
        )
        return
    digest = hashlib.sha256(b"".join((EXAMPLE / name).read_bytes() for name in EXAMPLE_SOURCES))
    stamp = dist / ".gateway-built"
    if stamp.exists() and stamp.read_text() == digest.hexdigest():
        return
    print("building the useChat example (client_demo/examples/ai-sdk)", flush=True)
    done = subprocess.run([node, "build.mjs"], cwd=EXAMPLE, check=False)
    if done.returncode == 0:
        stamp.write_text(digest.hexdigest())
    else:
        shutil.rmtree(dist, ignore_errors=True)
        print(
            "the useChat example failed to build: it is not served at /examples/ai-sdk/", flush=True
        )


def run(*args: str) -> int:
    return subprocess.call([str(PYTHON), *args], cwd=ROOT)


def become(*args: str) -> int:
    """Run the command in this process's place (POSIX): a signal sent to `dev.py` (SIGTERM
    from a process manager, SIGINT) then reaches the gateway itself, which shuts down
    gracefully, instead of ending only `dev.py` and leaving the gateway holding the port."""
    if os.name != "posix":
        return run(*args)
    os.chdir(ROOT)
    sys.stdout.flush()
    os.execv(PYTHON, [str(PYTHON), *args])


def needs_js(args: list[str]) -> bool:
    """Whether the tests `args` select use the JavaScript packages: the whole suite, or a
    path inside a directory or file that runs Node.js or the example app."""
    paths = [arg.split("::")[0] for arg in args if not arg.startswith("-")]
    if not paths:
        return True
    return any(
        (ROOT / path).resolve().is_relative_to(ROOT / js)
        or (ROOT / js).is_relative_to((ROOT / path).resolve())
        for path in paths
        for js in JS_TESTS
    )


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"serve", "test", "lint"}:
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    ensure_venv()
    if command == "serve":
        ensure_js_packages((EXAMPLE,))
        ensure_example()
        return become("-m", "gateway", "serve", *rest)
    if command == "test":
        if needs_js(rest):
            ensure_js_packages()
            ensure_example()
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
