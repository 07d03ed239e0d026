"""Webhook pieces without a gateway: the signature as documented (docs/protocol.md §10), the
back-off bounds, what logs may say of an endpoint, and which batches pay for the outbox."""

from __future__ import annotations

import hashlib
import hmac
import logging

import httpx

from gateway.event_log.webhook_dispatch import _EndpointRequests, backoff_s, endpoint_host
from gateway.event_log.webhook_signature import signature, verify
from gateway.specs.shapes import webhook_data_models
from persistence.events import NewEvent
from persistence.webhooks import WEBHOOK_TYPES, WebhookPlan, webhook_type
from tests.support.specs import openapi

SECRET = "s" * 32


def test_the_signature_is_the_documented_hmac_of_timestamp_and_body() -> None:
    body = '{"id":"msg_1","type":"run.completed"}'
    expected = hmac.new(SECRET.encode(), f"1767225600.{body}".encode(), hashlib.sha256)
    assert signature(SECRET, "1767225600", body) == "v1=" + expected.hexdigest()
    header = signature(SECRET, "1767225600", body)
    assert verify(SECRET, "1767225600", body, header)
    assert verify(SECRET, "1767225600", body, f"v1=deadbeef {header}")  # during a rotation
    assert not verify(SECRET, "1767225601", body, header)
    assert not verify(SECRET, "1767225600", body + " ", header)
    assert not verify("t" * 32, "1767225600", body, header)


def test_back_off_doubles_up_to_its_cap_with_jitter_below_it() -> None:
    for attempts, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 10.0), (50, 10.0)]:
        waits = [backoff_s(attempts, 1.0, 10.0) for _ in range(200)]
        assert all(ceiling / 2 <= wait <= ceiling for wait in waits)
        assert len(set(waits)) > 1


def test_logs_name_an_endpoint_by_its_host_only() -> None:
    assert endpoint_host("https://hooks.example.com/T0/B1/secret-path?token=x") == (
        "hooks.example.com"
    )
    assert endpoint_host("http://127.0.0.1:8100/webhooks") == "127.0.0.1:8100"


def test_only_batches_with_an_announced_event_get_an_announcer() -> None:
    plan = WebhookPlan(("https://example.com/h",), frozenset({"approval.expired"}))

    def event(type_: str) -> NewEvent:
        return NewEvent("th_1", "run_1", type_, "2026-01-01T00:00:00.000Z", "{}")

    assert plan.announcer([event("message.delta")] * 100) is None
    assert plan.announcer([event("message.delta"), event("approval.decided")]) is not None
    assert webhook_type("approval.decided", {"expired": True}) == "approval.expired"
    assert webhook_type("approval.decided", {"decision": "approve"}) == "approval.decided"


def test_the_openapi_document_describes_every_webhook_type() -> None:
    assert tuple(webhook_data_models()) == WEBHOOK_TYPES
    assert tuple(openapi().document["webhooks"]) == WEBHOOK_TYPES


def test_httpx_request_lines_of_endpoints_are_dropped_however_httpx_writes_the_url() -> None:
    quiet = _EndpointRequests(["https://Hooks.Example.com:443/T0/secret?token=x"])

    def line(url: str) -> logging.LogRecord:
        args = ("POST", httpx.URL(url), "HTTP/1.1", 500, "Internal Server Error")
        return logging.LogRecord(
            "httpx", logging.INFO, "", 0, 'HTTP Request: %s %s "%s %d %s"', args, None
        )

    assert not quiet.filter(line("https://Hooks.Example.com:443/T0/secret?token=x"))
    assert quiet.filter(line("https://api.openai.com/v1/responses"))
