"""A compatible model server without an API key: it works with a model name, and the base URL
alone is refused with what is missing instead of leaving the gateway offline without a word."""

from __future__ import annotations

import pytest

from gateway.agents.model_providers import OFFLINE, default_model_name
from gateway.settings import SettingsError, load_settings
from tests.support.fork_server import run_gateway_command
from tests.support.gateway import ROOT

BASE_URL = "http://127.0.0.1:9/v1"


@pytest.fixture(autouse=True)
def no_openai_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "GATEWAY_MODEL"):
        monkeypatch.delenv(name, raising=False)


def test_a_base_url_alone_is_refused_naming_what_is_missing() -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings(openai_base_url=BASE_URL)
    message = str(refused.value)
    assert "OPENAI_BASE_URL is set" in message and "GATEWAY_MODEL" in message


def test_a_base_url_with_a_model_or_a_key_is_used() -> None:
    named = load_settings(openai_base_url=BASE_URL, model="llama3.1")
    assert default_model_name(None, named.model) == "llama3.1"
    keyed = load_settings(openai_base_url=BASE_URL, openai_api_key="sk-test")
    assert keyed.model is None  # the key's default model, on the compatible server
    offline = load_settings(openai_base_url=BASE_URL, model=OFFLINE)
    assert default_model_name(None, offline.model) == OFFLINE


def test_serve_with_a_base_url_alone_exits_with_one_line(tmp_path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OPENAI_BASE_URL": BASE_URL}
    done = run_gateway_command(["serve", "--port", "0"], env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    assert "OPENAI_BASE_URL is set" in done.stderr and "GATEWAY_MODEL" in done.stderr
    assert "Traceback" not in done.stderr and "gateway ready" not in done.stderr + done.stdout
