"""Where an identity provider's token says who the caller is: claim paths and a role mapping.

The gateway's own tokens (signed with GATEWAY_SECRET) carry `sub`, `tenant` and `roles` at the
top level. Identity providers put them elsewhere: Keycloak's realm roles are in
`realm_access.roles`, Auth0's custom claims are namespaced URLs (`https://example.com/roles`),
Entra ID's app roles are in `roles` and its tenant in `tid`. A `ClaimMapping` says where to
find each (dotted paths), which tenant to assume in a single-tenant deployment, and how the
provider's role names map onto the gateway's roles. It applies to tokens verified with the
JWKS; the gateway's own tokens keep their layout, so development tokens always verify.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# What is not there: distinct from a claim that is present with a null value.
MISSING = object()


def claim_at(claims: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path, or MISSING.

    At every level the longest run of segments that is a key wins, so a namespaced claim whose
    name holds dots (`https://example.com/roles`) is found as one key, and `realm_access.roles`
    as two levels when no key has that whole name.
    """
    value: Any = claims
    parts = path.split(".")
    while parts:
        if not isinstance(value, Mapping):
            return MISSING
        for length in range(len(parts), 0, -1):
            key = ".".join(parts[:length])
            if key in value:
                value, parts = value[key], parts[length:]
                break
        else:
            return MISSING
    return value


@dataclass(frozen=True)
class ClaimMapping:
    user: str = "sub"
    tenant: str = "tenant"
    roles: str = "roles"
    # Single-tenant deployments: every caller is in this tenant, whatever the token says.
    fixed_tenant: str | None = None
    # The provider's role name -> the gateway role (or a custom role of an agent graph). With a
    # mapping, only mapped names count; without one, names are taken as gateway roles.
    role_map: Mapping[str, str] = field(default_factory=dict)

    @property
    def lenient_roles(self) -> bool:
        """Whether role names the gateway does not know are ignored rather than refused.

        The gateway's own layout refuses them (a typo in a role would silently demote a
        reviewer); a provider's token always carries roles meant for other applications
        (`offline_access`, `uma_authorization`...), so with a mapping or a roles path of its
        own they are ignored.
        """
        return bool(self.role_map) or self.roles != ClaimMapping.roles

    def role_names(self, raw: object) -> list[str]:
        """The gateway role names of a provider's roles claim (for `lenient_roles`): a list,
        or a space-separated string as some providers send; anything else is no roles. With a
        role map only mapped names count, mapped."""
        if isinstance(raw, str):
            names = raw.split()
        elif isinstance(raw, list):
            names = [name for name in raw if isinstance(name, str)]
        else:
            names = []
        if not self.role_map:
            return names
        return [self.role_map[name] for name in names if name in self.role_map]


def parse_role_map(text: str) -> dict[str, str]:
    """`idp-name=gateway-role,other=reviewer` -> a mapping; ValueError names a bad pair."""
    mapping: dict[str, str] = {}
    for pair in (item.strip() for item in text.split(",")):
        if not pair:
            continue
        name, sep, role = (part.strip() for part in pair.partition("="))
        if not sep or not name or not role:
            raise ValueError(f"{pair!r} is not of the form provider-role=gateway-role")
        mapping[name] = role
    return mapping
