"""dev.py: which test selections need the JavaScript packages installed first."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from tests.support.gateway import ROOT


def dev_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dev_script", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_selections_with_javascript_tests_install_the_packages() -> None:
    needs_js = dev_script().needs_js
    assert needs_js([])  # the whole suite
    assert needs_js(["-x", "-q"])
    assert needs_js(["tests"])
    assert needs_js(["tests/frontends"])
    assert needs_js(["tests/integration/test_js_client.py::test_something"])
    assert not needs_js(["tests/unit"])
    assert not needs_js(["tests/unit", "-q", "-k", "frames"])
    assert not needs_js(["tests/integration/test_leases.py"])
