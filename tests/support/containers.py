"""The gateway's container image (deploy/Dockerfile) built and run with podman, offline.

No container registry is reachable from the test machines, so the image's base is made here:
Debian bookworm from Debian's package mirror with `debootstrap --variant=minbase`, with Python
3.11 and its venv module, imported into podman as `BASE_IMAGE` and passed to the build as its
`BASE` argument. The base is kept between runs (podman's store), so only the first run on a
machine pays for it. The build itself installs the gateway's dependencies from PyPI, as a user's
build does, and podman's layer cache keeps them while pyproject.toml is unchanged.

Containers run with `--runtime runc --network host`, under tests/deploy/containers.conf
(`CONTAINERS_CONF`): this machine's kernel takes no container ulimits and has no systemd.
Without podman (or debootstrap for a missing base) the tests skip, or fail under
GATEWAY_REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import REQUIRE_SERVICES
from tests.support.gateway import TEST_SECRET
from tests.support.ports import free_port
from tests.support.redis import bus_prefix

ROOT = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = ROOT / "tests" / "deploy" / "containers.conf"
BASE_IMAGE = "localhost/agents-ws-gateway-base:bookworm"
IMAGE = "localhost/agents-ws-gateway:test"
DEBIAN_MIRROR = os.environ.get("GATEWAY_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What the image's build needs of its base besides Debian's minimal system.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
# Parts of the bootstrapped system no container reads: a smaller base, a smaller image.
BASE_TRIM = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man")
# Read-only files of the host the build may read, when the host has them: its trusted CAs and
# pip's configuration (an intercepting proxy's CA reaches pip in the build this way).
BUILD_MOUNTS = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pip.conf")
BUILD_TIMEOUT_S = 900.0
# A deploy test's limit (pytest-timeout), its share of the session's image build included: the
# first test on a machine makes the base and builds the image, on a loaded machine slowly.
DEPLOY_TEST_TIMEOUT_S = 2 * BUILD_TIMEOUT_S + 300
# The marks of a test module that runs the image (its `pytestmark`): one worker runs all such
# tests (dev.py's --dist loadgroup), so the session builds the image once.
IMAGE_TEST_MARKS = [
    pytest.mark.deploy,
    pytest.mark.timeout(DEPLOY_TEST_TIMEOUT_S),
    pytest.mark.xdist_group("deploy-image"),
]


def missing(message: str) -> None:
    if REQUIRE_SERVICES:
        pytest.fail(message + " (GATEWAY_REQUIRE_SERVICES=1)")
    pytest.skip(message)


def require_podman() -> None:
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            missing(f"{tool} is not installed (apt-get install podman runc debootstrap)")


def podman(
    *args: str, timeout: float = 120.0, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """`podman ARGS` under the tests' containers.conf; its output as text."""
    done = subprocess.run(
        ["podman", *args],
        env={**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done


def image_exists(tag: str) -> bool:
    return podman("image", "exists", tag, check=False).returncode == 0


def ensure_base_image() -> float:
    """Make `BASE_IMAGE` unless podman has it; the seconds it took (0 when it was there)."""
    if image_exists(BASE_IMAGE):
        return 0.0
    if shutil.which("debootstrap") is None:
        missing("debootstrap is not installed, and the base image is not built yet")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gateway-base-", dir="/var/tmp") as workdir:
        rootfs = Path(workdir) / "rootfs"
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                "bookworm",
                str(rootfs),
                DEBIAN_MIRROR,
            ],
            check=True,
            capture_output=True,
            timeout=BUILD_TIMEOUT_S,
        )
        for part in BASE_TRIM:
            shutil.rmtree(rootfs / part, ignore_errors=True)
        tarball = Path(workdir) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
        podman("import", "--change", 'CMD ["/bin/bash"]', str(tarball), BASE_IMAGE, timeout=300)
    return time.monotonic() - started


def build_image() -> float:
    """`podman build` of deploy/Dockerfile on `BASE_IMAGE` as `IMAGE`; the seconds it took."""
    started = time.monotonic()
    previous = podman("image", "inspect", "--format", "{{.Id}}", IMAGE, check=False).stdout.strip()
    mounts = [f"--volume={path}:{path}:ro" for path in BUILD_MOUNTS if Path(path).is_file()]
    podman(
        "build",
        "--network=host",
        "--format=docker",  # keeps the HEALTHCHECK (the OCI format has none)
        f"--build-arg=BASE={BASE_IMAGE}",
        *mounts,
        "--file",
        str(ROOT / "deploy" / "Dockerfile"),
        "--tag",
        IMAGE,
        str(ROOT),
        timeout=BUILD_TIMEOUT_S,
    )
    # The image this build replaced, if any; the untagged build-stage images stay, as the
    # layer cache of the next build.
    if (
        previous
        and previous != podman("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    ):
        podman("rmi", previous, check=False)
    return time.monotonic() - started


def image_size_bytes(tag: str = IMAGE) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())


@dataclass
class Container:
    """A gateway container on the host's network, listening on `port`."""

    name: str
    port: int
    volumes: list[str] = field(default_factory=list)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return done.stdout + done.stderr

    def state(self, field_: str) -> str:
        return podman("inspect", "--format", f"{{{{.State.{field_}}}}}", self.name).stdout.strip()

    def running(self) -> bool:
        return self.state("Running") == "true"

    def exit_code(self) -> int:
        return int(self.state("ExitCode"))

    def kill(self) -> None:
        """SIGKILL to the gateway (PID 1): nothing of its shutdown runs, as in a crash."""
        podman("kill", "--signal", "KILL", self.name)
        podman("wait", self.name, timeout=30, check=False)

    def stop(self, timeout_s: int = 30) -> None:
        """SIGTERM, as an orchestrator stops a container; SIGKILL after `timeout_s`."""
        podman("stop", "--time", str(timeout_s), self.name, timeout=timeout_s + 30)

    def start(self) -> None:
        """Start the stopped container again: the same name, instance id and settings."""
        podman("start", self.name)

    def remove(self) -> None:
        """Remove the container and its volumes; its log's end goes to the test's captured
        output, which pytest shows when the test fails."""
        print(f"--- log of {self.name} (port {self.port}) ---\n{self.logs()[-6000:]}")
        # --volumes: the anonymous volume the image's VOLUME /data gave it too.
        podman("rm", "--force", "--volumes", "--time", "0", self.name, check=False)
        for volume in self.volumes:
            podman("volume", "rm", "--force", volume, check=False)

    async def wait_ready(self, timeout_s: float = 90.0) -> float:
        """Poll `/readyz` until 200; the seconds it took. Fails with the logs if it exits."""
        started = time.monotonic()
        async with httpx.AsyncClient(timeout=2) as http:
            while True:
                try:
                    if (await http.get(f"{self.http_url}/readyz")).status_code == 200:
                        return time.monotonic() - started
                except httpx.HTTPError:
                    pass
                if not self.running():
                    raise RuntimeError(f"container {self.name} exited:\n{self.logs()}")
                if time.monotonic() - started > timeout_s:
                    raise TimeoutError(f"container {self.name} not ready:\n{self.logs()}")
                await asyncio.sleep(0.1)


def run_container(
    port: int,
    env: dict[str, str],
    *,
    args: tuple[str, ...] = (),
    data_volume: bool = False,
    name: str | None = None,
) -> Container:
    """Start the image detached, as a user would harden it: read-only root filesystem, /tmp
    a tmpfs, no capabilities, no new privileges; `data_volume` gives /data a volume of its own
    (SQLite's file). `args` follow the image's entrypoint (`serve` by default)."""
    name = name or f"gwtest-{secrets.token_hex(5)}"
    container = Container(name, port)
    options = [
        "--detach",
        f"--name={name}",
        "--runtime=runc",
        "--network=host",
        "--read-only",
        "--tmpfs=/tmp",
        "--cap-drop=all",
        "--security-opt=no-new-privileges",
        # The image's HEALTHCHECK is run by the tests themselves (`podman healthcheck run`):
        # podman's own timer needs systemd.
        "--health-interval=disable",
    ]
    if data_volume:
        volume = f"{name}-data"
        podman("volume", "create", volume)
        container.volumes.append(volume)
        options.append(f"--volume={volume}:/data")
    environment = [
        f"--env={key}={value}" for key, value in {"GATEWAY_PORT": str(port), **env}.items()
    ]
    podman("run", *options, *environment, IMAGE, *(args or ("serve",)))
    return container


def run_once(
    env: dict[str, str], *args: str, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run the image's entrypoint with `args` to completion (`migrate`, `runs list`)."""
    environment = [f"--env={key}={value}" for key, value in env.items()]
    return podman(
        "run",
        "--rm",
        "--runtime=runc",
        "--network=host",
        "--read-only",
        "--health-interval=disable",
        *environment,
        IMAGE,
        *args,
        timeout=timeout,
        check=False,
    )


def replicas_env(database_url: str, redis_url: str, **settings: str) -> dict[str, str]:
    """The environment of replicas on one PostgreSQL database and one Redis (with a channel
    prefix of the test's own), the demo agent writing a delta every 15 ms; `settings` added."""
    return {
        "GATEWAY_SECRET": TEST_SECRET,
        "GATEWAY_DATABASE_URL": database_url,
        "GATEWAY_BUS_URL": redis_url,
        "GATEWAY_BUS_PREFIX": bus_prefix(),
        "GATEWAY_DEMO_DELAY_MS": "15",
        **settings,
    }


def start_replicas(
    env: dict[str, str], containers: list[Container], names: Sequence[str] = ("gw-a", "gw-b")
) -> list[Container]:
    """The schema migrated once (the image's `migrate`), then one replica per instance id of
    `names` with `serve --no-migrate`, each on a port of its own and added to `containers` (to
    be removed when the test ends) as it starts. Not waited for: see `Container.wait_ready`."""
    migrated = run_once(env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    replicas: list[Container] = []
    for name in names:
        replica = run_container(
            free_port(), {**env, "GATEWAY_INSTANCE_ID": name}, args=("serve", "--no-migrate")
        )
        containers.append(replica)
        replicas.append(replica)
    return replicas
