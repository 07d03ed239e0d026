"""When the terminal client renews a token (client_demo/terminal.py `token_times`): at 80 % of
the remaining lifetime, at least 3 s before `exp`, and never late because of a skewed clock."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from client_demo.terminal import duration, token_claims, token_times


def jwt_like(claims: dict[str, Any]) -> str:
    """A token shaped like a JWT; the client never checks the signature, the gateway does."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(claims)}.c2ln"


def test_a_long_lifetime_is_renewed_at_80_percent() -> None:
    times = token_times(jwt_like({"iat": 1000, "exp": 4600}), received_at=1000.0)
    assert times is not None
    assert (times.expires_at, times.renew_at) == (4600.0, 1000.0 + 0.8 * 3600)


def test_a_short_lifetime_is_renewed_at_least_3_s_before_it_expires() -> None:
    times = token_times(jwt_like({"iat": 1000, "exp": 1008}), received_at=1000.0)
    assert times is not None
    assert times.renew_at == 1005.0


def test_a_local_clock_that_is_behind_does_not_make_the_renewal_late() -> None:
    # Received when the issuer's clock said 1000, but this clock says 900: by `exp` alone the
    # client would think it has 160 s; counted from arrival, the 60 s lifetime ends at 960.
    times = token_times(jwt_like({"iat": 1000, "exp": 1060}), received_at=900.0)
    assert times is not None
    assert (times.expires_at, times.renew_at) == (960.0, 900.0 + 48.0)


def test_a_local_clock_that_is_ahead_renews_at_once() -> None:
    times = token_times(jwt_like({"iat": 1000, "exp": 1060}), received_at=1100.0)
    assert times is not None
    assert (times.expires_at, times.renew_at) == (1060.0, 1100.0)


def test_a_token_without_iat_goes_by_exp() -> None:
    times = token_times(jwt_like({"exp": 1100}), received_at=1000.0)
    assert times is not None
    assert (times.expires_at, times.renew_at) == (1100.0, 1080.0)


@pytest.mark.parametrize(
    "token",
    [
        "not-a-token",
        "a.b",
        "a.%%%.c",
        jwt_like({"iat": 1000}),
        jwt_like({"exp": "1060"}),
        jwt_like({"exp": True}),
    ],
)
def test_tokens_without_a_usable_exp_are_not_timed(token: str) -> None:
    assert token_times(token, received_at=1000.0) is None


def test_claims_of_a_non_object_payload_are_none() -> None:
    assert token_claims("a." + base64.urlsafe_b64encode(b"[1]").decode() + ".c") is None


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.4, "0 s"), (45, "45 s"), (600, "10 min"), (7500, "2 h 5 min")]
)
def test_durations_read_naturally(seconds: float, text: str) -> None:
    assert duration(seconds) == text
