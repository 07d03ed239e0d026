"""Settings of authentication (the HS256 secret, an identity provider's keys and claims) and of
the browser origins allowed to call the gateway."""

from __future__ import annotations

from typing import Annotated, ClassVar, Self
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode

from gateway.auth.access import secret_key
from gateway.auth.claims import ClaimMapping, parse_role_map
from gateway.auth.jwks import JwksError, load_jwks_file
from gateway.protocol.close_codes import CloseCode
from gateway.settings.group import OptionalSecret, OptionalText, SettingsGroup
from gateway.settings.listening import is_loopback

# Where the usual frontend dev servers serve an app on this machine (Vite's dev server and its
# preview, Create React App and Next.js, webpack and Vue CLI, Angular): allowed in development
# mode, which only listens on loopback, so a new app talks to the gateway without a setting.
DEV_SERVER_PORTS = (5173, 4173, 3000, 8080, 4200)
DEV_SERVER_ORIGINS = tuple(
    f"http://{host}:{port}" for port in DEV_SERVER_PORTS for host in ("localhost", "127.0.0.1")
)


class TokenSettings(SettingsGroup):
    """How clients prove who they are (tokens signed with the gateway's secret, or by an identity
    provider whose keys and claims are configured here), and which browser origins may call the
    gateway.

    `GATEWAY_SECRET` can only be set in the environment, on purpose: command lines are visible to
    every user of the machine (`ps`)."""

    section_key: ClassVar[str] = "tokens"
    section_title: ClassVar[str] = "tokens and origins"

    secret: OptionalSecret = Field(
        None,
        description=(
            "The HS256 key for client JWTs. While it and the JWKS settings below are all unset, the"
            " gateway runs in development mode: it generates a random secret at each start, enables"
            " `POST /v1/dev/token`, logs a warning and listens on loopback only. With only a JWKS "
            "set, HS256 tokens are refused and there are no development tokens. An empty value "
            "counts as unset. A value shaped like a public key (PEM, SSH or DER) or a JWK stops "
            "start-up. Processes that share a database need the same value."
        ),
    )
    jwt_leeway_s: int = Field(
        10,
        ge=0,
        le=300,
        description=(
            "Clock skew, in whole seconds (0-300), tolerated when checking a token's `exp` and "
            f"`nbf`. A WebSocket connection is closed with {int(CloseCode.UNAUTHORIZED)} this long "
            "after its token's `exp`, "
            "unless the client sent a new `hello` first (see `docs/protocol.md` §3)."
        ),
    )
    jwt_issuer: OptionalText = Field(
        None,
        max_length=512,
        description=(
            "When set, every token must carry an `iss` claim equal to it. Development tokens carry "
            "it."
        ),
    )
    jwt_audience: OptionalText = Field(
        None,
        max_length=512,
        description=(
            "When set, every token must carry an `aud` claim equal to it (or a list containing it)."
            " Development tokens carry it. While unset, a token that carries any `aud` is refused."
        ),
    )
    jwks_file: OptionalText = Field(
        None,
        description=(
            'Path to a JWKS file (`{"keys": [...]}`) with an identity provider\'s public keys, for '
            "RS256 (RSA keys, at least 2048 bits) and ES256 (EC P-256 keys) tokens. Every key needs"
            " a `kid`; keys whose `use` is not `sig` are ignored. The file is read and checked at "
            "start-up: an unreadable file, symmetric (`oct`) or private keys, another key type or "
            "curve, an `alg` that does not match the key type, or a repeated `kid` stops the "
            "gateway."
        ),
    )
    jwks_url: OptionalText = Field(
        None,
        max_length=2048,
        description=(
            "URL of an identity provider's JWKS, fetched when a token needs a key not in the cache."
            " Must be `https://` (`http://` only for a loopback host) and carry no credentials; "
            "redirects are not followed. Keys the gateway cannot use are skipped with a warning. If"
            " the keys cannot be fetched and no cached key fits the token, the client gets "
            "`unavailable` (retryable), not `unauthorized`. Set either this or `GATEWAY_JWKS_FILE`,"
            " not both."
        ),
    )
    jwks_cache_s: float = Field(
        300.0,
        ge=1.0,
        le=86_400.0,
        description=(
            "Seconds (1-86400) fetched keys are used before the next token triggers a new fetch. If"
            " that fetch fails, the cached keys go on working."
        ),
    )
    jwks_refetch_s: float = Field(
        30.0,
        ge=0.0,
        le=3600.0,
        description=(
            "Least seconds (0-3600) between two fetches of the JWKS URL, whatever triggers them (an"
            " unknown `kid`, stale keys, a failed fetch), so tokens with made-up key ids cannot "
            "flood the provider. A token issued after the last fetch whose `kid` is unknown "
            "before the next fetch is allowed (a freshly rotated key) is refused as retryable "
            "`unavailable`, saying when to try again."
        ),
    )
    jwt_user_claim: str = Field(
        "sub",
        min_length=1,
        max_length=256,
        description=(
            "Claim path of the user id in tokens verified with the JWKS (for example "
            '`preferred_username`, `oid`); see docs/protocol.md §3, "identity-provider claims".'
        ),
    )
    jwt_tenant_claim: str = Field(
        "tenant",
        min_length=1,
        max_length=256,
        description=(
            "Claim path of the tenant in tokens verified with the JWKS (for example `tid`, or a "
            "namespaced `https://…/tenant`)."
        ),
    )
    jwt_roles_claim: str = Field(
        "roles",
        min_length=1,
        max_length=256,
        description=(
            "Claim path of the roles in tokens verified with the JWKS (for example "
            "`realm_access.roles`). Another path than `roles` makes unknown role names ignored "
            "instead of refused."
        ),
    )
    jwt_tenant: OptionalText = Field(
        None,
        min_length=1,
        max_length=256,
        description=(
            "Every caller with a JWKS-verified token is in this tenant (single-tenant deployments);"
            " the tenant claim is not read."
        ),
    )
    jwt_role_map: str = Field(
        "",
        max_length=8192,
        description=(
            "`provider-role=gateway-role,...`: the provider's role names that count, and the "
            "gateway role (`user`, `reviewer`, `viewer`, `admin`, or a reviewer role an agent graph"
            " names) each becomes. Other names are ignored. A target the gateway does not know "
            "stops start-up."
        ),
    )
    allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description=(
            "Comma-separated browser origins allowed besides the gateway's own, for example "
            "`https://chat.example.com,https://admin.example.com`: pages there may open the "
            "WebSockets and call the HTTP API (CORS). Case and a trailing `/` are ignored. In "
            "development mode the usual local dev servers' origins are allowed too: "
            "`http://localhost:P` and `http://127.0.0.1:P` for the ports "
            + ", ".join(str(port) for port in DEV_SERVER_PORTS)
            + "."
        ),
    )

    @field_validator("allowed_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip().rstrip("/") for item in value.split(",") if item.strip()]
        return value

    @field_validator("secret")
    @classmethod
    def _secret_is_no_public_key(cls, value: SecretStr | None) -> SecretStr | None:
        # Checked now so such a secret stops start-up instead of failing every token later.
        if value is not None:
            secret_key(value.get_secret_value())
        return value

    @field_validator("jwks_file")
    @classmethod
    def _readable_jwks(cls, value: str | None) -> str | None:
        # Read now so a bad file stops start-up instead of refusing every token later.
        if value is not None:
            try:
                load_jwks_file(value)
            except JwksError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("jwks_url")
    @classmethod
    def _trusted_jwks_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in {"https", "http"} or not parts.hostname:
            raise ValueError("must be an https:// URL")
        # Whoever can alter the key set can mint tokens: plain HTTP only on this machine.
        if parts.scheme == "http" and not is_loopback(parts.hostname):
            raise ValueError("must use https:// (http:// only for a loopback host)")
        if parts.username or parts.password:
            raise ValueError("must not contain credentials")
        return value.strip()

    @field_validator("jwt_role_map")
    @classmethod
    def _role_map_pairs(cls, value: str) -> str:
        parse_role_map(value)  # raises ValueError naming the bad pair
        return value

    @model_validator(mode="after")
    def _one_jwks_source(self) -> Self:
        if self.jwks_file is not None and self.jwks_url is not None:
            raise ValueError("set GATEWAY_JWKS_FILE or GATEWAY_JWKS_URL, not both")
        return self

    def claim_mapping(self) -> ClaimMapping:
        return ClaimMapping(
            user=self.jwt_user_claim,
            tenant=self.jwt_tenant_claim,
            roles=self.jwt_roles_claim,
            fixed_tenant=self.jwt_tenant,
            role_map=parse_role_map(self.jwt_role_map),
        )

    @property
    def jwks_configured(self) -> bool:
        return self.jwks_file is not None or self.jwks_url is not None

    @property
    def dev_mode(self) -> bool:
        # With only a JWKS, tokens come from the identity provider: no made-up secret and no
        # development tokens, which would let anyone mint identities next to the real ones.
        return self.secret is None and not self.jwks_configured

    def browser_origins(self) -> list[str]:
        """The origins besides the gateway's own whose pages may use it, in lower case."""
        origins = [origin.rstrip("/").lower() for origin in self.allowed_origins]
        if self.dev_mode:
            origins += [origin for origin in DEV_SERVER_ORIGINS if origin not in origins]
        return origins
