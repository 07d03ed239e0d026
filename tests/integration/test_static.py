"""The browser demo at `/`: served, with strict security headers."""

from __future__ import annotations

from gateway.transport.static_files import CONTENT_SECURITY_POLICY, PERMISSIONS_POLICY


async def test_demo_page_is_served_with_security_headers(gateway) -> None:
    async with gateway.http() as http:
        page = await http.get("/")
        script = await http.get("/js/main.js")
    assert page.status_code == 200
    assert "<html" in page.text.lower()
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["cross-origin-opener-policy"] == "same-origin"
    assert page.headers["cross-origin-resource-policy"] == "same-origin"
    assert page.headers["permissions-policy"] == PERMISSIONS_POLICY
    assert "camera=()" in page.headers["permissions-policy"]
    assert page.headers["cache-control"] == "no-cache"
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    # Every response of the mount carries them, not only the page.
    assert script.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert script.headers["x-content-type-options"] == "nosniff"


async def test_api_routes_are_not_shadowed_by_the_static_mount(gateway) -> None:
    async with gateway.http() as http:
        health = await http.get("/healthz")
        missing = await http.get("/no-such-file.js")
    assert health.json() == {"status": "ok"}
    assert missing.status_code == 404


async def test_the_client_package_is_served_to_the_demo(gateway) -> None:
    """The page is built on client_demo/js: its modules are served as they are in the package."""
    async with gateway.http() as http:
        index = await http.get("/js/gateway-client/index.js")
        fold = await http.get("/js/gateway-client/thread.js")
        listing = await http.get("/js/gateway-client/")
        outside = await http.get("/js/gateway-client/../package.json")
    assert index.status_code == 200
    assert index.headers["content-type"].startswith("text/javascript")
    assert index.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "export { GatewayClient }" in index.text
    assert "export function applyEvent" in fold.text
    assert listing.status_code == 404  # no directory listing, no index page
    assert outside.status_code == 404
