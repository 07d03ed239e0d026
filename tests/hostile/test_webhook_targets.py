"""Webhook targets where cloud machines keep their credentials (link-local addresses, the
metadata services' names and addresses) are refused unless GATEWAY_WEBHOOK_ALLOW_LINK_LOCAL
allows them: at start-up as written, and before a delivery as resolved."""

from __future__ import annotations

import pytest

from gateway.event_log.webhook_dispatch import resolves_to_forbidden
from gateway.settings import SettingsError, load_settings

SECRET = "s" * 40
FORBIDDEN = [
    "http://169.254.169.254/latest/meta-data/",
    "https://169.254.10.20:8443/hook",
    "http://[fe80::1]/hook",
    "http://[::ffff:169.254.169.254]/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://[fd00:ec2::254]/",
]


@pytest.mark.parametrize("url", FORBIDDEN)
def test_a_link_local_or_metadata_target_refuses_start_up(url: str) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings(webhook_url=[url], webhook_secret=SECRET)
    assert "GATEWAY_WEBHOOK_ALLOW_LINK_LOCAL" in str(refused.value)
    allowed = load_settings(webhook_url=[url], webhook_secret=SECRET, webhook_allow_link_local=True)
    assert allowed.webhook_url == [url]


def test_ordinary_targets_are_accepted() -> None:
    urls = ["https://hooks.example.com/in", "http://127.0.0.1:9000/hook", "http://10.0.0.5/"]
    assert load_settings(webhook_url=urls, webhook_secret=SECRET).webhook_url == urls


async def test_a_name_is_checked_as_it_resolves() -> None:
    assert await resolves_to_forbidden("169.254.169.254", 80) == "169.254.169.254"
    assert await resolves_to_forbidden("localhost", 80) is None
    assert await resolves_to_forbidden("no-such-host.invalid", 80) is None
