#!/usr/bin/env python3
"""Bootstrap and run the project with nothing but Python 3.11+.

    python3 dev.py serve [flags]   create .venv if needed, then serve the demo gateway
                                   (with Node.js and npm present, it first builds the useChat
                                   example app it serves at /examples/ai-sdk/)
    python3 dev.py test [args]     create .venv if needed, then run the whole test suite on
                                   several workers (pytest-xdist; GATEWAY_TEST_WORKERS, or -n N,
                                   sets how many; a file or a single test runs in one process)
                                   (with Node.js and npm present, it first installs the
                                   JavaScript client's dev dependencies, so its tests run too;
                                   not for a selection without JavaScript tests, e.g. tests/unit)
    python3 dev.py test --fast     the fast loop: unit and contract tests on SQLite, in one
                                   process, under a minute
    python3 dev.py test --newest   the whole suite in .venv-newest, against the newest versions
                                   pyproject.toml's ranges allow (the lockfile ignored)
    python3 dev.py lint            ruff (lint + format check), the layer rules (import-linter)
                                   and the types (mypy, strict; the JavaScript client's
                                   declarations with tsc --strict)
    python3 dev.py lock            pin every dependency anew in requirements.lock (uv)

The virtual environment is rebuilt when pyproject.toml or requirements.lock changes, so the two
quick-start commands keep working from a fresh clone and after every pull.
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
# The versions CI installs: every dependency of the project and of its tests pinned, as a pip
# constraints file (`dev.py lock` writes it; tests/unit/test_lockfile.py checks it is current).
LOCK = ROOT / "requirements.lock"
LOCKED_EXTRAS = ("test", "postgres", "redis", "otel")
# `dev.py test --newest`: a virtual environment of its own, upgraded on every run.
NEWEST_VENV = ROOT / ".venv-newest"
# Workers for the whole suite: twice the cores of the machine it is sized for (2). Most tests
# wait on timers and subprocesses rather than the CPU, so more workers than cores pay; more
# than that and the gateways the tests start compete for the CPU until their waits run out.
WORKERS = os.environ.get("GATEWAY_TEST_WORKERS", "4")
# The fast loop: no server, no service but SQLite files.
FAST = ("-m", "(unit or contract) and not postgres and not redis", "-n", "0")
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
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    if LOCK.exists():
        digest.update(LOCK.read_bytes())
    return digest.hexdigest()


def python_of(venv_dir: Path) -> Path:
    return venv_dir / ("Scripts" if os.name == "nt" else "bin") / PYTHON.name


def ensure_venv(venv_dir: Path = VENV, *, newest: bool = False) -> Path:
    """The virtual environment's Python, with the project and its test dependencies installed:
    at the lockfile's versions (a constraints file, so a dependency added to pyproject.toml
    and not yet locked still installs), or with `newest` the newest its ranges allow."""
    if sys.version_info < (3, 11):  # noqa: UP036 (this file runs before any venv exists)
        sys.exit(f"Python 3.11+ is required (this is {sys.version.split()[0]})")
    python = python_of(venv_dir)
    stamp = venv_dir / ".installed"
    if not newest and stamp.exists() and stamp.read_text() == fingerprint() and python.exists():
        return python
    if not python.exists():
        print(f"creating virtual environment in {venv_dir}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(venv_dir)
    print("installing the project and its test dependencies", flush=True)
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--upgrade", "pip"], check=True)
    project = f"{ROOT}[{','.join(LOCKED_EXTRAS)}]"
    if newest:
        upgrade = ["--upgrade", "--upgrade-strategy", "eager"]
        subprocess.run([*pip, "install", *upgrade, "-e", project], check=True)
        subprocess.run([*pip, "list", "--format=freeze"], check=True)
        return python
    constraints = ["--constraint", str(LOCK)] if LOCK.exists() else []
    subprocess.run([*pip, "install", *constraints, "-e", project], check=True)
    stamp.write_text(fingerprint())
    return python


def lock() -> int:
    """Resolve every dependency of the project and its extras anew with uv (installed into
    the virtual environment on first use) into requirements.lock, for any platform."""
    uv = [str(PYTHON), "-m", "uv"]
    if subprocess.call([*uv, "--version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        pip = [str(PYTHON), "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run([*pip, "install", "uv"], check=True)
    extras = [arg for extra in LOCKED_EXTRAS for arg in ("--extra", extra)]
    compile_ = ["pip", "compile", "pyproject.toml", *extras, "--universal"]
    target = ["--python-version", "3.11", "--no-header", "--quiet", "-o", LOCK.name]
    return subprocess.call([*uv, *compile_, *target], cwd=ROOT)


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


def run(*args: str, python: Path = PYTHON) -> int:
    return subprocess.call([str(python), *args], cwd=ROOT)


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
    # Only what names a file or folder: not an option's value (`-p no:cacheprovider`, `-k x`).
    paths = [arg.split("::")[0] for arg in args if not arg.startswith("-")]
    paths = [path for path in paths if (ROOT / path).exists()]
    if not paths:
        return True
    return any(
        (ROOT / path).resolve().is_relative_to(ROOT / js)
        or (ROOT / js).is_relative_to((ROOT / path).resolve())
        for path in paths
        for js in JS_TESTS
    )


def parallel(args: list[str]) -> list[str]:
    """The workers to add to pytest's arguments: none when the arguments choose (-n, -p
    no:xdist, a debugger) or name only files or single tests, which one process runs sooner
    than workers start."""
    chosen = {"-n", "--numprocesses", "no:xdist", "--pdb", "--trace", "-s"}
    if any(arg in chosen or arg.startswith(("-n", "--numprocesses=")) for arg in args):
        return []
    selected = [arg for arg in args if not arg.startswith("-")]
    if selected and all((ROOT / arg.split("::")[0]).is_file() for arg in selected):
        return []
    # loadgroup: tests marked xdist_group run on one worker, the rest wherever one is free.
    return ["-n", WORKERS, "--dist", "loadgroup"]


def test(args: list[str]) -> int:
    newest = "--newest" in args
    args = [arg for arg in args if arg != "--newest"]
    python = ensure_venv(NEWEST_VENV, newest=True) if newest else ensure_venv()
    if "--fast" in args:
        args = [*FAST, *(arg for arg in args if arg != "--fast")]
    elif needs_js(args):
        ensure_js_packages()
        ensure_example()
    return run("-m", "pytest", *parallel(args), *args, python=python)


def lint() -> int:
    folders = ("gateway", "persistence", "client_demo", "tests", "bench")
    status = run("-m", "ruff", "check", *folders)
    status |= run("-m", "ruff", "format", "--check", *folders)
    # The layer rules: pyproject.toml [tool.importlinter].
    status |= subprocess.call([str(BIN / "lint-imports"), "--no-cache"], cwd=ROOT)
    # The types: pyproject.toml [tool.mypy], strict on gateway/ and persistence/.
    status |= run("-m", "mypy")
    status |= check_js_types()
    return status


def check_js_types() -> int:
    """The JavaScript client's declarations under `tsc --strict`, against the package's own
    typed example of its use (client_demo/js/test/typecheck). Needs Node.js and the package's
    dev dependencies (`npm ci` in client_demo/js, as `dev.py test` and CI run); without them it
    says so and passes, as its test in the suite then skips (a failure under CI)."""
    package = ROOT / "client_demo" / "js"
    tsc = package / "node_modules" / "typescript" / "bin" / "tsc"
    node = shutil.which("node")
    if node is None or not tsc.exists():
        print("JavaScript types not checked: needs Node.js and `npm ci` in client_demo/js")
        return 0
    config = package / "test" / "typecheck" / "tsconfig.json"
    return subprocess.call([node, str(tsc), "-p", str(config)], cwd=ROOT)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"serve", "test", "lint", "lock"}:
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "test":
        return test(rest)
    ensure_venv()
    if command == "serve":
        ensure_js_packages((EXAMPLE,))
        ensure_example()
        return become("-m", "gateway", "serve", *rest)
    if command == "lock":
        return lock()
    return lint()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
