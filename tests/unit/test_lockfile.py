"""requirements.lock, the versions `dev.py` installs and CI tests, is current: it pins every
dependency pyproject.toml declares (the project's and its extras'), each at a version the
declared range allows."""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.gateway import ROOT
from tests.unit.test_dev_script import dev_script

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", re.M)


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    names = [*project["dependencies"]]
    for extra in dev_script().LOCKED_EXTRAS:
        names += extras[extra]
    return [Requirement(name) for name in names]


def locked() -> dict[str, Version]:
    text = (ROOT / "requirements.lock").read_text()
    return {canonicalize_name(name): Version(version) for name, version in PIN.findall(text)}


def test_the_lock_pins_every_declared_dependency_within_its_range() -> None:
    pins = locked()
    stale = []
    for requirement in declared():
        pin = pins.get(canonicalize_name(requirement.name))
        if pin is None:
            stale.append(f"{requirement} is not in the lock")
        elif not requirement.specifier.contains(pin, prereleases=True):
            stale.append(f"{requirement} is locked at {pin}, outside its range")
    assert not stale, "requirements.lock is stale (run `python3 dev.py lock`): " + "; ".join(stale)


def test_the_lock_covers_the_extras_pyproject_declares() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(dev_script().LOCKED_EXTRAS) == set(extras), "lock every extra (dev.py LOCKED_EXTRAS)"
