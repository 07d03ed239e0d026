"""Where webhooks may not be sent: link-local addresses (169.254.0.0/16, fe80::/10), where cloud
machines find their metadata service and its credentials, and the metadata services' other
well-known names and addresses. A webhook URL is configuration, but a gateway that posts to
such a target on a configuration mistake (or an attacker's) hands out the machine's
credentials; `GATEWAY_WEBHOOK_ALLOW_LINK_LOCAL` allows them for the rare receiver that lives
there.

Checked twice: at start-up on the URLs' hosts as written (gateway/settings/webhooks.py), and
before each delivery on the addresses the host resolves to (gateway/event_log/webhook_dispatch.py),
since a name can point anywhere. Beside the deliveries' repository, below both.
"""

from __future__ import annotations

import ipaddress

# Metadata services outside the link-local ranges, and their names.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(address) for address in ("fd00:ec2::254", "100.100.100.200")
)
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata.goog", "metadata"})


def forbidden_address(address: str) -> bool:
    """Whether `address` (an IP address, with or without an IPv6 zone) is a forbidden target."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0].strip("[]"))
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_link_local or ip in METADATA_ADDRESSES


def forbidden_host(host: str) -> bool:
    """Whether `host` as written (a name or an address literal) is a forbidden target."""
    return host.lower().rstrip(".") in METADATA_HOSTS or forbidden_address(host)
