"""Real disk trouble for storage tests: a small tmpfs that can be filled, and a database file
made read-only (immutable) even for root, both undone at the end.

Both need privileges (mounting, `chattr`): without them the test is skipped with the reason,
or fails under GATEWAY_REQUIRE_SERVICES=1, like a missing service.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REQUIRE_SERVICES


def _unavailable(message: str) -> None:
    if REQUIRE_SERVICES:
        pytest.fail(message + " (GATEWAY_REQUIRE_SERVICES=1)")
    pytest.skip(message)


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=False)


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (e.g. `4m`) mounted at `path` for the block's duration."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = _run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    if mounted.returncode != 0:
        _unavailable(f"cannot mount a tmpfs at {path}: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        # Lazy: a process that still holds a file there must not make teardown fail.
        _run("umount", "-l", str(path))


def fill(path: Path, chunk: int = 64 * 1024) -> Path:
    """Write a file in `path` until its file system is full; the file, to remove later.

    Unbuffered: a buffered writer keeps what the full disk refused and raises again when it is
    closed. Once a chunk no longer fits, smaller ones fill what is left, down to one byte."""
    filler = path / "filler"
    block = b"\0" * chunk
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while chunk:
            try:
                os.write(fd, block[:chunk])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                chunk //= 2
    finally:
        os.close(fd)
    return filler


@contextlib.contextmanager
def immutable(file: Path) -> Iterator[Path]:
    """`file` made immutable (`chattr +i`): opened for writing it is refused, even for root,
    which ignores permission bits; SQLite then opens it read-only."""
    made = _run("chattr", "+i", str(file))
    if made.returncode != 0:
        _unavailable(f"cannot make {file} immutable: {made.stderr.strip()}")
    try:
        yield file
    finally:
        _run("chattr", "-i", str(file))


def writable_again(file: Path) -> None:
    undone = _run("chattr", "-i", str(file))
    assert undone.returncode == 0, undone.stderr
