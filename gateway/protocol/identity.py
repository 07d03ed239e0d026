"""Who a connection or a request speaks for: a user of a tenant with roles (docs/protocol.md §3).

The protocol's own value, so that its rules (a later hello must keep the user and tenant, the
`welcome` names them) need nothing of how tokens are verified (gateway/auth/).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Role(StrEnum):
    USER = "user"
    REVIEWER = "reviewer"
    VIEWER = "viewer"
    ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    user: str
    tenant: str
    roles: frozenset[Role]
    # Roles beyond the four of docs/protocol.md §3 that agent graphs name for their tools (for
    # example `finance` for `issue_refund`); only names the verifier was told about are accepted.
    extra_roles: frozenset[str] = frozenset()
    # Where the request came from (the client address), set by the transport after
    # verification with `dataclasses.replace`, so the audit trail can say "from where".
    source: str | None = None
    # The token's `exp` (Unix seconds): a long-lived connection stops honouring the token
    # then (plus the verifier's leeway). Not part of equality: it says when, not who.
    expires_at: float | None = field(default=None, compare=False)
    # The token claims agent graphs asked for (`AgentGraph.context_claims`), by claim path,
    # for the runs this caller starts; the others are not kept. Not in the repr: claims can be
    # personal data (an email), and a principal can end up in a log line.
    claims: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def has(self, role: Role) -> bool:
        return role in self.roles

    def has_any(self, *roles: Role) -> bool:
        return not self.roles.isdisjoint(roles)
