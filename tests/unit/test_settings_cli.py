"""`serve`'s flags and docs/configuration.md's sections against `Settings` and its groups, which
both are made from.

Regenerate the document with `.venv/bin/python -m gateway.settings_docs`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.__main__ import parser, settings_from
from gateway.agents.model_providers import DEFAULT_OPENAI_MODEL, OFFLINE
from gateway.protocol.error_codes import ErrorCode, GatewayError
from gateway.server.workers import SET_FOR_WORKERS
from gateway.settings import GROUPS, Settings, SettingsError, load_settings
from gateway.settings_cli import (
    DESCRIBED_DEFAULTS,
    ENVIRONMENT_ONLY,
    SECTIONS,
    SWITCH_OFF_FLAGS,
    flag,
    flags,
    value_type,
)
from gateway.settings_docs import CONFIGURATION, DocumentError, block, main, render

REGENERATE = "regenerate with `.venv/bin/python -m gateway.settings_docs`"
# Flags that scripts, tests and the documents outside docs/configuration.md use: a rename
# breaks them, whatever the generated table says.
FLAGS_IN_USE = {
    "--agents",
    "--workers",
    "--port",
    "--host",
    "--database-url",
    "--tracing",
    "--otel",
    "--metrics",
    "--log-format",
    "--runs-per-minute",
    "--frames-per-s",
    "--frame-burst",
    "--max-subscriptions",
    "--max-pending-inputs",
    "--max-input-chars",
    "--max-connections-per-user",
    "--forwarded-allow-ips",
    "--no-demo",
    "--no-migrate",
}


def serve(*argv: str) -> Settings:
    return settings_from(parser().parse_args(["serve", *argv]))


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in Settings.model_fields:
        monkeypatch.delenv(f"GATEWAY_{name.upper()}", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("GATEWAY_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    return monkeypatch


def test_every_setting_has_a_description_a_section_and_a_flag_or_a_reason() -> None:
    fields = list(Settings.model_fields)
    undescribed = [name for name, field in Settings.model_fields.items() if not field.description]
    assert not undescribed, f"settings without a description: {undescribed}"
    placed = [name for section in SECTIONS for name in section.fields]
    assert sorted(placed) == sorted(fields), (
        f"each setting belongs to exactly one section of gateway/settings_cli.py: "
        f"not placed {sorted(set(fields) - set(placed))}, "
        f"twice {sorted({n for n in placed if placed.count(n) > 1})}, "
        f"unknown {sorted(set(placed) - set(fields))}"
    )
    for listed in (ENVIRONMENT_ONLY, SWITCH_OFF_FLAGS, DESCRIBED_DEFAULTS):
        assert set(listed) <= set(fields), f"not settings: {sorted(set(listed) - set(fields))}"
    assert all(reason.strip() for reason in ENVIRONMENT_ONLY.values())
    for name in SWITCH_OFF_FLAGS:
        assert Settings.model_fields[name].default is True, f"{name} is not on by default"
    assert len({flag(name) for name in fields if name not in ENVIRONMENT_ONLY}) == len(
        fields
    ) - len(ENVIRONMENT_ONLY), "two settings share a flag"


def test_serve_offers_a_flag_for_every_setting_not_kept_to_the_environment() -> None:
    serve_parser = parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    offered = {
        action.dest: option
        for action in serve_parser._actions
        for option in action.option_strings
        if action.dest != "help"
    }
    expected = {name: flag(name) for name in Settings.model_fields if name not in ENVIRONMENT_ONLY}
    assert offered == expected
    assert FLAGS_IN_USE <= set(offered.values())
    groups = [group.title for group in serve_parser._action_groups]
    assert groups == ["positional arguments", "options"] + [
        section.title
        for section in SECTIONS
        if any(name not in ENVIRONMENT_ONLY for name in section.fields)
    ]


def test_secrets_cannot_be_given_on_the_command_line() -> None:
    for name in ("secret", "webhook_secret", "openai_api_key"):
        assert flag(name) is None
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--secret", "x" * 32])


def test_a_flag_wins_over_its_variable_and_an_unset_flag_leaves_it(
    clean_environment: pytest.MonkeyPatch,
) -> None:
    clean_environment.setenv("GATEWAY_PORT", "9100")
    clean_environment.setenv("GATEWAY_APPROVAL_TTL_S", "30")
    clean_environment.setenv("GATEWAY_METRICS", "true")
    clean_environment.setenv("GATEWAY_DEMO_UI", "false")
    from_environment = serve()
    assert (from_environment.port, from_environment.approval_ttl_s) == (9100, 30.0)
    assert from_environment.metrics is True and from_environment.demo_ui is False
    given = serve("--port", "9101", "--approval-ttl-s", "2.5")
    assert (given.port, given.approval_ttl_s) == (9101, 2.5)
    assert given.metrics is True, "an unset boolean flag must not turn its variable off"
    clean_environment.setenv("GATEWAY_DEMO_UI", "true")
    assert serve("--no-demo").demo_ui is False
    assert serve("--no-migrate").migrate is False and serve().migrate is True


def test_flag_values_parse_as_their_variables_do(clean_environment: pytest.MonkeyPatch) -> None:
    # Webhook endpoints need their secret, which only the environment gives.
    clean_environment.setenv("GATEWAY_WEBHOOK_SECRET", "s" * 32)
    settings = serve(
        "--allowed-origins",
        "https://a.example/, https://b.example",
        "--webhook-url",
        "https://hooks.example/in,http://127.0.0.1:9/x",
        "--webhook-events",
        "run.completed,run.cancelled",
        "--bus-url",
        "redis://127.0.0.1:6379/2",
        "--lease-scan-s",
        "0.5",
        "--metrics-port",
        "0",
        "--log-format",
        "json",
        "--log-level",
        "DEBUG",
        "--self-approval",
        "--four-eyes",
        "--tracing",
        "--otel",
        "--allow-damaged-database",
        "--instance-id",
        "gw-1",
    )
    assert settings.allowed_origins == ["https://a.example", "https://b.example"]
    assert settings.webhook_url == ["https://hooks.example/in", "http://127.0.0.1:9/x"]
    assert settings.webhook_events == ["run.completed", "run.cancelled"]
    assert settings.bus_url == "redis://127.0.0.1:6379/2"
    assert (settings.lease_scan_s, settings.metrics_port) == (0.5, 0)
    assert (settings.log_format, settings.log_level, settings.instance_id) == (
        "json",
        "debug",
        "gw-1",
    )
    assert settings.self_approval and settings.four_eyes and settings.tracing
    assert settings.otel and settings.allow_damaged_database


def test_a_bad_flag_value_is_refused_naming_its_variable(
    clean_environment: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--port", "eighty"])  # argparse: not an int
    with pytest.raises(SettingsError, match="GATEWAY_PORT"):
        serve("--port", "70000")
    with pytest.raises(SettingsError, match="GATEWAY_OPENAI_API"):
        serve("--openai-api", "completions")
    with pytest.raises(SettingsError, match="GATEWAY_BUS_URL"):
        serve("--bus-url", "http://127.0.0.1:6379")


def test_flags_parse_numbers_and_booleans_and_leave_the_rest_to_the_settings() -> None:
    kinds = {name: value_type(field) for name, field in Settings.model_fields.items()}
    assert (kinds["port"], kinds["metrics_port"], kinds["lease_scan_s"]) == (int, int, float)
    assert (kinds["metrics"], kinds["demo_ui"]) == (bool, bool)
    assert kinds["allowed_origins"] is str and kinds["openai_api"] is str


def test_the_operator_commands_and_migrate_take_the_database_flag() -> None:
    for command in (
        ["migrate"],
        ["runs", "list"],
        ["runs", "show", "r1"],
        ["runs", "cancel", "r1"],
        ["approvals", "list"],
        ["threads", "export", "t1"],
    ):
        args = parser().parse_args([*command, "--database-url", "sqlite:///x.db"])
        assert args.database_url == "sqlite:///x.db", command
        assert parser().parse_args(command).database_url is None, command


def test_the_supervisor_sets_the_flags_it_takes_from_its_workers_command_line() -> None:
    assert {"--workers", "--instance-id", "--host", "--port"} == SET_FOR_WORKERS
    with pytest.raises(ValueError, match="secret"):
        flags(("port", "secret"))


def test_described_defaults_name_the_model_defaults() -> None:
    assert OFFLINE in DESCRIBED_DEFAULTS["model"]
    assert DEFAULT_OPENAI_MODEL in DESCRIBED_DEFAULTS["model"]


def test_the_committed_configuration_document_is_the_generator_output() -> None:
    text = CONFIGURATION.read_text(encoding="utf-8")
    assert text == render(text), f"docs/configuration.md's settings tables are stale; {REGENERATE}"


def test_every_section_has_one_table_in_the_document() -> None:
    text = CONFIGURATION.read_text(encoding="utf-8")
    with pytest.raises(DocumentError, match="missing"):
        render(text.replace("<!-- settings: webhooks -->", "<!-- webhooks -->"))
    with pytest.raises(DocumentError, match="unknown"):
        render(text + "\n<!-- settings: nonsense -->\n<!-- /settings -->\n")


def test_check_mode_reports_a_stale_document(tmp_path: Path, capsys) -> None:
    stale = tmp_path / "configuration.md"
    text = CONFIGURATION.read_text(encoding="utf-8")
    stale.write_text(
        text.replace(
            "| `GATEWAY_PORT` | `--port` | `8000` |", "| `GATEWAY_PORT` | `--port` | `80` |"
        )
    )
    assert main(["--check", "--file", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert main(["--file", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == text
    assert main(["--check", "--file", str(stale)]) == 0


def test_help_lists_each_flag_with_its_variable_and_default(capsys) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    assert "--lease-ttl-s" in text and "GATEWAY_LEASE_TTL_S, default: 15]" in text
    assert "sets GATEWAY_DEMO_UI=false" in text
    assert "--secret" not in text


def test_switch_off_flags_say_what_they_switch_off(capsys) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--help"])
    # argparse wraps help at the terminal's width: compare the words, not the lines.
    text = " ".join(capsys.readouterr().out.split())
    assert "--no-demo Do not serve the browser demo" in text
    assert "--no-migrate Do not migrate the schema at start-up" in text
    assert "[sets GATEWAY_MIGRATE=false; without it: true]" in text


def test_settings_are_their_groups_together_each_a_section() -> None:
    assert Settings.__bases__ == GROUPS
    assert [section.key for section in SECTIONS] == [group.section_key for group in GROUPS]
    assert len({section.key for section in SECTIONS}) == len(SECTIONS)
    assert len({section.title for section in SECTIONS}) == len(SECTIONS)
    for group, section in zip(GROUPS, SECTIONS, strict=True):
        assert vars(group)["__doc__"], f"{group.__name__} says nothing of its concern"
        assert section.fields == tuple(group.model_fields)
        assert section.summary and "\n" not in section.summary
    config = Settings.model_config
    assert (config.get("env_prefix"), config.get("frozen"), config.get("extra")) == (
        "GATEWAY_",
        True,
        "ignore",
    )


def test_each_section_of_the_document_is_headed_and_introduced_by_its_group() -> None:
    text = CONFIGURATION.read_text(encoding="utf-8")
    tokens = next(section for section in SECTIONS if section.key == "tokens")
    written = block(tokens)
    assert written.startswith("### Tokens and origins\n\nHow clients prove who they are")
    assert "`GATEWAY_SECRET` can only be set in the environment" in written
    assert f"<!-- settings: tokens -->\n{written}<!-- /settings -->" in text


def test_help_heads_each_group_of_flags_with_its_summary(capsys) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for section in SECTIONS:
        if any(flag(name) for name in section.fields):
            summary = " ".join(section.summary.replace("`", "").split())
            assert f"{section.title}: {summary}" in text


def test_configuration_errors_are_internal_gateway_errors(
    clean_environment: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings(port=70000)
    error = refused.value
    assert isinstance(error, GatewayError) and isinstance(error, ValueError)
    assert error.code is ErrorCode.INTERNAL
    assert str(error) == error.message
    assert error.message.startswith("invalid configuration: GATEWAY_PORT: ")
    with pytest.raises(DocumentError) as stale:
        render("no sections")
    assert isinstance(stale.value, GatewayError) and stale.value.code is ErrorCode.INTERNAL
