"""Gateway settings, read once from the environment (GATEWAY_*) and validated at start-up.

A bad value stops the server with a message naming the variable (see `load_settings`). Each
field's description is what `serve --help` and docs/configuration.md say of it (both are made
from these fields: gateway/settings_cli.py, gateway/settings_docs.py).
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gateway.auth.claims import ClaimMapping, parse_role_map
from gateway.auth.jwks import JwksError, load_jwks_file
from gateway.protocol.close_codes import CloseCode
from gateway.protocol.error_codes import ERRORS, ErrorCode
from persistence.schema import DEFAULT_DATABASE_URL
from persistence.webhook_targets import forbidden_host
from persistence.webhooks import DEFAULT_WEBHOOK_TYPES, WEBHOOK_TYPES

# Shorter secrets are refused: they are the receivers' only proof that a webhook is ours.
MIN_WEBHOOK_SECRET_CHARS = 16

ENV_PREFIX = "GATEWAY_"

# Where the usual frontend dev servers serve an app on this machine (Vite's dev server and its
# preview, Create React App and Next.js, webpack and Vue CLI, Angular): allowed in development
# mode, which only listens on loopback, so a new app talks to the gateway without a setting.
DEV_SERVER_PORTS = (5173, 4173, 3000, 8080, 4200)
DEV_SERVER_ORIGINS = tuple(
    f"http://{host}:{port}" for port in DEV_SERVER_PORTS for host in ("localhost", "127.0.0.1")
)


class SettingsError(ValueError):
    """Invalid configuration; the message names the offending variable(s)."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    host: str = Field(
        "127.0.0.1",
        description=(
            "Listen address. Must be a loopback address (`127.0.0.0/8`, `::1`, `localhost`) in "
            "development mode (neither `GATEWAY_SECRET` nor a JWKS set)."
        ),
    )
    forwarded_allow_ips: str = Field(
        "127.0.0.1",
        max_length=4096,
        description=(
            "Peers whose `X-Forwarded-For` and `X-Forwarded-Proto` are believed: the addresses or "
            "networks of your reverse proxies, comma-separated (`10.0.0.0/8,192.168.1.5`), `*` for "
            "any peer (only when nothing but the proxy can reach the gateway), empty for none. The "
            "client address they forward is the one the audit trail records. Anything that is not "
            "an address, a network or `*` stops start-up."
        ),
    )
    demo_ui: bool = Field(
        True,
        description=(
            "Serve the browser demo and the client package's modules at `/`. Off, the gateway "
            "serves its API only (what an application that embeds the gateway wants)."
        ),
    )
    port: int = Field(
        8000,
        ge=0,
        le=65535,
        description="Listen port, 0-65535; `0` picks any free port.",
    )
    database_url: str = Field(
        DEFAULT_DATABASE_URL,
        description=(
            "The store: a SQLite file (`sqlite:///path`, also `sqlite+aiosqlite:///path`; not "
            "`:memory:`) or PostgreSQL (`postgresql://user:password@host:port/dbname`, also "
            "`postgresql+asyncpg://…`; needs `pip install 'agents-ws-gateway[postgres]'`). A "
            "relative SQLite path is relative to the working directory (`dev.py` runs from the "
            "project root), and its parent directory is created if needed. The schema is migrated "
            "at every start (unless `GATEWAY_MIGRATE=false`)."
        ),
    )
    migrate: bool = Field(
        True,
        description=(
            "Migrate the schema to this gateway's revision at start-up. Off (`false`, or `--no-"
            "migrate`), the gateway migrates nothing and refuses to start on any other revision, "
            "with one error line naming the database's revision and the one it needs: for "
            "deployments that migrate as a step of their own (`python -m gateway migrate`, or "
            "Alembic's command line on `persistence/alembic.ini`; see docs/operations.md \"Before "
            'the first start").'
        ),
    )
    secret: SecretStr | None = Field(
        None,
        description=(
            "The HS256 key for client JWTs. While it and the JWKS settings below are all unset, the"
            " gateway runs in development mode: it generates a random secret at each start, enables"
            " `POST /v1/dev/token`, logs a warning and listens on loopback only. With only a JWKS "
            "set, HS256 tokens are refused and there are no development tokens. An empty value "
            "counts as unset. Processes that share a database need the same value."
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
    jwt_issuer: str | None = Field(
        None,
        max_length=512,
        description=(
            "When set, every token must carry an `iss` claim equal to it. Development tokens carry "
            "it."
        ),
    )
    jwt_audience: str | None = Field(
        None,
        max_length=512,
        description=(
            "When set, every token must carry an `aud` claim equal to it (or a list containing it)."
            " Development tokens carry it. While unset, a token that carries any `aud` is refused."
        ),
    )
    jwks_file: str | None = Field(
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
    jwks_url: str | None = Field(
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
    jwt_tenant: str | None = Field(
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
            "WebSocket and call the HTTP API (CORS). Case and a trailing `/` are ignored. In "
            "development mode the usual local dev servers' origins are allowed too: "
            "`http://localhost:P` and `http://127.0.0.1:P` for the ports "
            + ", ".join(str(port) for port in DEV_SERVER_PORTS)
            + "."
        ),
    )
    self_approval: bool = Field(
        False,
        description=(
            "Whether a thread's owner may decide the approvals of their own runs. Reviewers and "
            "admins always can. The default only: a tool whose agent graph says who decides it "
            "(`decided_by`: the run's own user, reviewers or either) follows that instead."
        ),
    )
    four_eyes: bool = Field(
        False,
        description=(
            "Four-eyes: the user who requested a run (sent the `run.start`, or the `run.input` that"
            " started it) may never approve a call of that run, even as a reviewer or admin and "
            "even with `GATEWAY_SELF_APPROVAL`; rejecting stays allowed. A run started later from "
            "queued input counts the thread's owner as its requester."
        ),
    )
    approval_ttl_s: float = Field(
        0.0,
        ge=0,
        description=(
            "Seconds (≥ 0) an approval may wait for a decision; `0` means forever. Past it the "
            "system rejects the approval (status `expired`, `approval.decided` with `expired: true`"
            ' and no reviewer); the model is told "The approval request expired after N seconds '
            'without a decision." and the run continues as after a rejection. A decision arriving '
            "later gets `conflict`. Applies to approvals requested while it is set; a changed value"
            " does not touch approvals already waiting."
        ),
    )
    approval_sweep_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description=(
            "Seconds (0 < s ≤ 3600) between looks for expired approvals, so an unattended approval "
            "expires at most this late. Only used when `GATEWAY_APPROVAL_TTL_S` is above 0; a late "
            "decision is refused at once either way."
        ),
    )
    suspend_grace_s: float = Field(
        15.0,
        ge=0,
        description=(
            'Seconds (≥ 0) a streaming `on_disconnect: "suspend"` run may go unwatched (watchers '
            "are counted in the process that executes it) before it is checkpointed at its next "
            "turn boundary and suspended (`run.paused` reason `disconnect`). A new watcher "
            "continues it."
        ),
    )
    max_frame_bytes: int = Field(
        65536,
        ge=1024,
        le=16 * 1024 * 1024,
        description=(
            "Largest client WebSocket frame (1024 to 16 MiB). Larger frames close the socket with "
            f"{int(CloseCode.TOO_LARGE)}. Also passed to uvicorn as its WebSocket size limit."
        ),
    )
    demo_delay_ms: int = Field(
        15,
        ge=0,
        le=10_000,
        description=(
            "Pause between the offline model's text deltas (0 to 10000 ms); `0` streams as fast as "
            "possible."
        ),
    )
    model: str | None = Field(
        None,
        description=(
            "Model name. `offline` selects the deterministic offline model for every agent whose "
            "model is a name or unset. Any other name selects the SDK's multi-provider: a plain "
            "name or `openai/<name>` goes to OpenAI (or the server at `OPENAI_BASE_URL`), "
            "`litellm/<provider>/<model>` through LiteLLM (`pip install 'openai-agents[litellm]'`)."
            " The name is used by the demo agent and is passed as `model_name` to an agent registry"
            " factory (see docs/agents.md); the start-up log says, for every graph, which model its"
            " starting agent runs on and through what."
        ),
    )
    openai_api: Literal["responses", "chat_completions"] = Field(
        "responses",
        description=(
            "How OpenAI or a compatible server is called: `responses` (the Responses API) or "
            "`chat_completions` (what most compatible servers speak)."
        ),
    )
    agents: str | None = Field(
        None,
        description=(
            "Your agent registry as `package.module:attribute`: an `AgentRegistry`, or a callable "
            "returning one. The module must be importable (the project root when started through "
            "`dev.py`, otherwise set `PYTHONPATH`)."
        ),
    )
    heartbeat_s: float = Field(
        20.0,
        gt=0,
        description=(
            "Seconds between server `ping` frames (> 0); announced to clients as `heartbeat_s`; "
            "also the interval of the SSE feed's `: heartbeat` comments."
        ),
    )
    hello_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Seconds a new socket has to send `hello` (> 0) before it is closed with "
        f"{int(CloseCode.UNAUTHORIZED)}.",
    )
    send_queue_size: int = Field(
        1024,
        ge=16,
        description=(
            "Outgoing frames buffered per connection (≥ 16). Live events that do not fit are read "
            "from the log later, at the client's pace; an `inbox.update` that does not fit closes "
            f"the connection with {int(CloseCode.TOO_SLOW)}. The SSE feeds "
            "(`GET /v1/threads/{thread_id}/stream`, `GET "
            "/v1/approvals/stream`) have a queue of this size too; an inbox feed that overflows it "
            "ends."
        ),
    )
    send_timeout_s: float = Field(
        5.0,
        gt=0,
        description=(
            "Seconds (> 0) a frame may wait for room in a full outgoing queue before the connection"
            f" is closed with {int(CloseCode.TOO_SLOW)}. The client catches up by subscribing "
            "with `after_seq`. A streaming HTTP response (an SSE feed, an AI SDK or AG-UI "
            "stream) whose client takes nothing of what was written for this long is ended "
            f"(`event: end` with {int(CloseCode.TOO_SLOW)}); the client resumes with its "
            "`Last-Event-ID`."
        ),
    )
    frontend_body_bytes: int = Field(
        1024 * 1024,
        ge=65536,
        le=16 * 1024 * 1024,
        description=(
            "Largest request body, or WebSocket frame, of the frontend adapters (the Vercel AI "
            "SDK's and AG-UI's; 64 KiB to 16 MiB). Their clients send the whole conversation with "
            "every request, of which only the newest message is used; a larger one gets "
            "`too_large`."
        ),
    )
    ai_sdk_replay_window_s: float = Field(
        60.0,
        ge=0,
        le=86400,
        description=(
            "How long after a chat's response ends (the run finished, or paused on calls its "
            "reader decides) a resume of the Vercel AI SDK's transports still replays it, so a "
            "client that dropped just before the end gets the end (0 to 86400 s). Replaying a "
            "message the client already has whole gives the same message. `0`: only a running "
            "response is resumed, as the AI SDK's own servers do."
        ),
    )
    max_input_chars: int = Field(
        32_000,
        ge=1,
        description=(
            "Longest `input` accepted by `run.start` / `run.input` (≥ 1); a longer one gets "
            "`too_large`."
        ),
    )
    send_queue_bytes: int = Field(
        1024 * 1024,
        ge=64 * 1024,
        description=(
            "Outgoing bytes (UTF-8) buffered per connection (≥ 65536), beside "
            "`GATEWAY_SEND_QUEUE_SIZE` frames: the queue is full when either is reached. A single "
            "frame larger than this still goes into a queue below it."
        ),
    )
    idle_timeout_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description=(
            "Seconds (0 < s ≤ 3600) a connection may stay silent before sending a request: from the"
            " moment it is opened, and between two requests on a keep-alive connection. Then it is "
            "closed."
        ),
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description=(
            "Seconds (0 < s ≤ 3600) from a connection's opening (or the end of its previous "
            "response) to a complete request head, however slowly its bytes arrive. Then it is "
            "answered 408 and closed. A WebSocket upgrade is such a request; once upgraded, the "
            "client has `GATEWAY_HELLO_TIMEOUT_S` for its `hello`."
        ),
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description=(
            "Seconds (0 < s ≤ 3600) from a complete request head to the end of its body, whether "
            "the endpoint reads the body or answered before it. Then the connection is closed."
        ),
    )
    max_header_bytes: int = Field(
        16 * 1024,
        ge=1024,
        le=1024 * 1024,
        description=(
            "Largest request head, in bytes of header lines plus the target (1 KiB to 1 MiB). A "
            "larger one is answered 431 (`bad_request`) and the connection closed after what the "
            "client still sends is read; a WebSocket upgrade is refused (403)."
        ),
    )
    max_headers: int = Field(
        100,
        ge=8,
        le=10_000,
        description=(
            "Most header lines in a request (8 to 10000); more: 431, or 403 for an upgrade."
        ),
    )
    max_connections: int = Field(
        1000,
        ge=0,
        description=(
            "Open connections per process, HTTP and WebSocket together (≥ 0, `0` = no bound). A "
            "connection beyond it is answered `503` (`unavailable`, `Retry-After: 1`) and closed at"
            " once, and one warning per minute says how many were refused. At start-up the gateway "
            "checks that the bound, `GATEWAY_BACKLOG` and a reserve of 64 fit the process's open-"
            "files limit; it raises the soft limit up to the hard one if needed, and if that is "
            "still too small it lowers the bound to fit, with a warning."
        ),
    )
    backlog: int = Field(
        511,
        ge=1,
        le=65535,
        description=(
            "Length of the listen queue (1 to 65535): connections the kernel holds before the "
            "gateway accepts them. asyncio accepts up to this many at a time, so it counts against "
            "the open-files limit too."
        ),
    )
    frames_per_s: float = Field(
        20.0,
        ge=0,
        description=(
            "Client frames per second per connection after `hello` (≥ 0, `0` = no limit), refilling"
            " a bucket of `GATEWAY_FRAME_BURST`. Frames over it get `rate_limited` with "
            "`retry_after_s` and are not handled; a client that keeps sending after refusals is "
            f"closed with {int(CloseCode.FLOODING)}. Pongs answering the server's pings are free."
        ),
    )
    frame_burst: int = Field(
        100,
        ge=1,
        description=(
            "Frames (≥ 1) a connection may send at once before `GATEWAY_FRAMES_PER_S` applies; also"
            f" how many refusals are tolerated before the {int(CloseCode.FLOODING)} close. Keep it "
            "above "
            "`GATEWAY_MAX_SUBSCRIPTIONS` so a reconnecting client can resubscribe to everything at "
            "once."
        ),
    )
    runs_per_minute: int = Field(
        30,
        ge=0,
        description=(
            "Runs a user may start in any 60 s (≥ 0, `0` = no limit): `run.start` and `run.input` "
            "that starts a run, over the WebSocket or HTTP (`POST /v1/runs`, `POST "
            "/v1/threads/{thread_id}/input`). Over it: `rate_limited` with `retry_after_s`. Counted"
            " across every process on a Redis bus (`GATEWAY_BUS_URL`), else per process; each "
            "process hears of the others' starts over the bus within milliseconds, so two starts on"
            " two processes inside that moment are both admitted."
        ),
    )
    max_connections_per_user: int = Field(
        20,
        ge=0,
        description=(
            "Open WebSocket connections and SSE feeds per user, counted together (≥ 0, `0` = no "
            "limit). One more WebSocket gets `rate_limited` after its `hello` and is closed with "
            f"{int(CloseCode.TOO_MANY_CONNECTIONS)}; one more feed gets "
            f"{int(ERRORS[ErrorCode.RATE_LIMITED].http_status)} `rate_limited`. Counted across "
            "every process on a Redis "
            "bus, else per process."
        ),
    )
    max_subscriptions: int = Field(
        100,
        ge=0,
        description=(
            "Thread subscriptions per connection (≥ 0, `0` = no limit), counting those `run.start` "
            "/ `run.input` make; the approval inbox does not count. Over it: `rate_limited`."
        ),
    )
    max_pending_inputs: int = Field(
        10,
        ge=0,
        description=(
            "Inputs that may wait on one thread, `queued` plus `staged` on its active run (≥ 0, `0`"
            " = no limit). Over it: `rate_limited`."
        ),
    )
    tracing: bool = Field(
        False,
        description=(
            "Send SDK traces to the SDK's configured trace exporter. Off by default, so nothing "
            "leaves the machine."
        ),
    )
    otel: bool = Field(
        False,
        description=(
            "Export the gateway's OpenTelemetry spans (WebSocket sessions, run segments, model and "
            "tool calls, approval waits, event-log transactions) over OTLP/HTTP to the endpoint of "
            "the standard `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` "
            "variables; needs the `otel` extra (`pip install 'agents-ws-gateway[otel]'`). "
            'Independent of `GATEWAY_TRACING`. See docs/operations.md "Traces".'
        ),
    )
    metrics: bool = Field(
        False,
        description=(
            "Serve Prometheus metrics at `GET /metrics` on the gateway's port (docs/operations.md, "
            '"Metrics"). Off, there is no such route and nothing is counted. Not protected by a '
            "token: expose it to the scraper only."
        ),
    )
    metrics_host: str = Field(
        "127.0.0.1",
        description="The address of the `GATEWAY_METRICS_PORT` listener.",
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description=(
            "Serve `GET /metrics` on this port (0: any free one, logged as `metrics at "
            "http://…/metrics`) instead of the gateway's, which then has no such route. Not with "
            "`GATEWAY_WORKERS` above 1 (a scrape of the gateway's port already adds up every "
            "worker)."
        ),
    )
    storage_probe_s: float = Field(
        5.0,
        gt=0,
        le=600,
        description=(
            "Seconds (0 < s ≤ 600) between the write probes that look whether storage is back after"
            ' a failure (docs/operations.md "Storage health"); no probe runs while storage is '
            "healthy."
        ),
    )
    allow_damaged_database: bool = Field(
        False,
        description=(
            "Start even when the SQLite file fails its integrity check at start-up; the damage is "
            "logged and `/readyz` answers 503. Off, such a file stops the gateway."
        ),
    )
    instance_id: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description=(
            "This process's name in run leases (1-64 characters). Every process running on the same"
            " database at the same time needs its own id: a process started under an id another "
            "live process holds is refused (the id is claimed in the database and the claim "
            "renewed every second). A process that starts again under the same id takes over the"
            " runs its previous incarnation left active at once, without waiting for their leases"
            " to expire."
        ),
    )
    lease_ttl_s: float = Field(
        15.0,
        ge=1.0,
        le=3600.0,
        description=(
            "Lifetime of a run lease in seconds (1-3600). A streaming run's lease is renewed every "
            "third of it, and every process looks for expired leases every `GATEWAY_LEASE_SCAN_S`, "
            "so the runs of a process that died are taken over by another process within this value"
            " plus the scan interval (1.5 times this value by default); a process started again "
            "under the dead one's instance id takes them over at once."
        ),
    )
    lease_scan_s: float | None = Field(
        None,
        ge=0.1,
        le=3600.0,
        description=(
            "How often each process looks for runs whose lease expired (0.1-3600 s). Shorter: a "
            "dead process's runs go on elsewhere sooner, for one more read of the `runs` table per "
            "scan and process."
        ),
    )
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description=(
            "Gateway processes serving the port (1-64). Above 1, `serve` runs a supervisor that "
            "binds the port, migrates the schema once, and starts that many worker processes on it "
            "(on Linux each on a socket of its own in the port's SO_REUSEPORT group, so the kernel "
            "spreads connections over them), each with the instance id "
            "`<GATEWAY_INSTANCE_ID or host name:port>/<n>`; a worker that dies is started again "
            "under its id and takes its runs over at once; SIGTERM stops them all gracefully. In "
            "development mode the workers share one signing secret. Set `GATEWAY_BUS_URL` to Redis "
            "with several workers, or events cross between them at the log watch's pace. See "
            'docs/operations.md "Several processes on one machine".'
        ),
    )
    listen_fd: int | None = Field(
        None,
        ge=0,
        description=(
            "Set by the `serve --workers` supervisor for each worker: the listening socket it "
            "inherited. Not for setting by hand."
        ),
    )
    ready_fd: int | None = Field(
        None,
        ge=0,
        description=(
            "Set by the `serve --workers` supervisor for each worker it starts with the gateway "
            "(not for one it starts again): the pipe the worker writes to once it serves, which "
            "the supervisor waits for before it says the gateway runs. Not for setting by hand."
        ),
    )
    supervisor_pid: int | None = Field(
        None,
        ge=1,
        description=(
            "Set by the `serve --workers` supervisor for each worker: its own pid, so that a worker"
            " stops when the supervisor is gone. Not for setting by hand."
        ),
    )
    dev_secret: SecretStr | None = Field(
        None,
        description=(
            "Set by the `serve --workers` supervisor for each worker in development mode: the "
            "signing secret they share. Not for setting by hand."
        ),
    )
    log_watch_interval_s: float = Field(
        0.5,
        ge=0.0,
        le=60.0,
        description=(
            "Seconds (0-60) between polls of the log heads of the threads this process has "
            "subscribers on, so that events written by other processes on the same database reach "
            "them. `0` turns polling off, which is fine for a single process per database."
        ),
    )
    bus_url: str = Field(
        "memory://",
        description=(
            "How gateway processes on one database wake each other: `memory://` (one process: "
            "nothing to tell) or a Redis URL (`redis://host:6379/0`, `rediss://…` for TLS; needs "
            "`pip install 'agents-ws-gateway[redis]'`). With Redis, a commit on one process reaches"
            " subscribers and inbox readers on every other at once; the log watch stays as the "
            "safety net while Redis is down."
        ),
    )
    bus_prefix: str = Field(
        "agents-gateway",
        min_length=1,
        max_length=128,
        description=(
            "Prefix of the Redis channel (`<prefix>:bus`): gateways with the same database and "
            "prefix hear each other; give each deployment sharing a Redis its own."
        ),
    )
    retention_s: float = Field(
        0.0,
        ge=0.0,
        description=(
            "Seconds (≥ 0) to keep the checkpoints and the event log of runs after they end; `0` "
            "keeps them forever. Older ones are removed by the retention sweep: the thread's log "
            "loses its beginning up to the last event of those runs, and the thread gets a new "
            "epoch (clients with an older cursor get `reset`). Runs, approvals, the operation "
            "ledger and the conversation history are kept."
        ),
    )
    retention_sweep_s: float = Field(
        3600.0,
        gt=0.0,
        description=(
            "Seconds (> 0) between retention sweeps; the first one runs one interval after start-"
            "up. Only used when `GATEWAY_RETENTION_S` is above 0."
        ),
    )
    webhook_url: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description=(
            "Endpoints that receive signed webhooks (docs/protocol.md §10), comma-separated; each "
            "an `http://` or `https://` URL with a host and without credentials, none twice. Every "
            "endpoint gets every type in `GATEWAY_WEBHOOK_EVENTS`. Logs name only an endpoint's "
            "host and port, never its path or query."
        ),
    )
    webhook_secret: SecretStr | None = Field(
        None,
        description=(
            "The HMAC-SHA256 key webhooks are signed with (at least 16 characters); required when "
            "`GATEWAY_WEBHOOK_URL` is set. Never logged."
        ),
    )
    webhook_events: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(DEFAULT_WEBHOOK_TYPES),
        description="The webhook types sent, comma-separated, from those and `run.cancelled`.",
    )
    webhook_timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description=(
            "Seconds (0 < s ≤ 300) an attempt may take, from connecting to the end of the answer; "
            "longer counts as a failed attempt."
        ),
    )
    webhook_max_attempts: int = Field(
        12,
        ge=1,
        le=1000,
        description=(
            "Attempts (1-1000) before a delivery is given up (kept as `failed`, with a warning)."
        ),
    )
    webhook_max_age_s: float = Field(
        86_400.0,
        gt=0,
        description=(
            "Seconds (> 0) after its event past which a delivery is not attempted again, however "
            "few attempts it had."
        ),
    )
    webhook_backoff_s: float = Field(
        2.0,
        gt=0,
        le=3600,
        description=(
            "Seconds (0 < s ≤ 3600) before the first retry; each further retry waits twice as long,"
            " each wait drawn between half and all of it."
        ),
    )
    webhook_max_backoff_s: float = Field(
        900.0,
        gt=0,
        le=86_400,
        description="The longest wait between two attempts (0 < s ≤ 86400).",
    )
    webhook_poll_s: float = Field(
        5.0,
        gt=0,
        le=600,
        description=(
            "Seconds (0 < s ≤ 600) between looks for retries falling due and for deliveries other "
            "processes left; a commit that adds deliveries wakes its own process at once."
        ),
    )
    webhook_allow_link_local: bool = Field(
        False,
        description=(
            "Allow webhook endpoints in the link-local ranges (169.254.0.0/16, fe80::/10), where "
            "cloud machines reach their metadata service and its credentials, and at the metadata "
            "services' other names and addresses. Off: such a URL refuses start-up, and a delivery "
            "to a name that resolves there fails (`forbidden address`)."
        ),
    )
    log_level: str = Field(
        "info",
        description=(
            "One of `critical`, `error`, `warning`, `info`, `debug`; applies to the gateway and "
            "uvicorn."
        ),
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description=(
            "`text`, or `json`: one JSON object per line (`time`, `level`, `logger`, `message`, and"
            " `thread_id`, `run_id`, `agent`, `connection_id` where the line belongs to a run or a "
            "connection), for the gateway's lines and uvicorn's alike. See docs/operations.md "
            '"Logs".'
        ),
    )

    # Read without the GATEWAY_ prefix: the SDK's own variables.
    openai_api_key: SecretStr | None = Field(
        None,
        validation_alias="OPENAI_API_KEY",
        description=(
            "API key for OpenAI or a compatible server. Setting it changes the default model from "
            "`offline` to `gpt-4.1-mini`. An empty value counts as unset."
        ),
    )
    openai_base_url: str | None = Field(
        None,
        validation_alias="OPENAI_BASE_URL",
        description=(
            "Base URL of an OpenAI-compatible server (one that serves the Responses API, or Chat "
            "Completions with `GATEWAY_OPENAI_API=chat_completions`), for example "
            "`http://localhost:8080/v1`. Without `OPENAI_API_KEY` it needs `GATEWAY_MODEL` (a "
            "model the server serves; no key is sent but a placeholder): the gateway refuses to "
            "start with the base URL alone rather than stay offline without a word."
        ),
    )

    @field_validator("allowed_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip().rstrip("/") for item in value.split(",") if item.strip()]
        return value

    @field_validator("webhook_url", "webhook_events", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("webhook_url")
    @classmethod
    def _http_endpoints(cls, value: list[str]) -> list[str]:
        for url in value:
            parts = urlsplit(url)
            if parts.scheme not in {"http", "https"} or not parts.hostname:
                raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
            if parts.username or parts.password:
                # Logged hosts would be safe, but the URL is stored with every delivery.
                raise ValueError("must not contain credentials (receivers check the signature)")
        if len(set(value)) != len(value):
            raise ValueError("names an endpoint twice")
        return value

    @field_validator("webhook_events")
    @classmethod
    def _known_webhook_events(cls, value: list[str]) -> list[str]:
        unknown = [item for item in value if item not in WEBHOOK_TYPES]
        if unknown:
            raise ValueError(
                f"unknown webhook event type(s) {', '.join(unknown)}: "
                f"choose from {', '.join(WEBHOOK_TYPES)}"
            )
        if not value:
            raise ValueError(f"must name at least one of {', '.join(WEBHOOK_TYPES)}")
        return value

    @field_validator(
        "secret",
        "webhook_secret",
        "openai_api_key",
        "jwt_issuer",
        "jwt_audience",
        "jwks_file",
        "jwks_url",
        "jwt_tenant",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("database_url")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme.split("+", 1)[0] not in {"sqlite", "postgresql", "postgres"}:
            raise ValueError(
                "must be a SQLite or PostgreSQL URL such as sqlite:///./gateway.db "
                "or postgresql://user@host/dbname"
            )
        return value

    @field_validator("bus_url")
    @classmethod
    def _known_bus(cls, value: str) -> str:
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme not in {"memory", "redis", "rediss", "unix"}:
            raise ValueError("must be memory:// or a Redis URL such as redis://127.0.0.1:6379/0")
        return value

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.lower()
        if level not in {"critical", "error", "warning", "info", "debug"}:
            raise ValueError("must be one of critical, error, warning, info, debug")
        return level

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

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _addresses_or_networks(cls, value: str) -> str:
        items = [item.strip() for item in value.split(",") if item.strip()]
        for item in items:
            if item == "*":
                continue
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or network (or *)") from None
        return ",".join(items)

    @field_validator("jwt_role_map")
    @classmethod
    def _role_map_pairs(cls, value: str) -> str:
        parse_role_map(value)  # raises ValueError naming the bad pair
        return value

    def claim_mapping(self) -> ClaimMapping:
        return ClaimMapping(
            user=self.jwt_user_claim,
            tenant=self.jwt_tenant_claim,
            roles=self.jwt_roles_claim,
            fixed_tenant=self.jwt_tenant,
            role_map=parse_role_map(self.jwt_role_map),
        )

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

    @model_validator(mode="after")
    def _one_jwks_source(self) -> Settings:
        if self.jwks_file is not None and self.jwks_url is not None:
            raise ValueError("set GATEWAY_JWKS_FILE or GATEWAY_JWKS_URL, not both")
        return self

    @model_validator(mode="after")
    def _dev_mode_is_loopback_only(self) -> Settings:
        if self.dev_mode and not is_loopback(self.host):
            raise ValueError(
                "GATEWAY_SECRET is unset (development tokens), so GATEWAY_HOST must be a "
                f"loopback address, not {self.host!r}; set GATEWAY_SECRET (or a JWKS) to "
                "listen publicly"
            )
        return self

    @model_validator(mode="after")
    def _compatible_server_names_its_model(self) -> Settings:
        # Without a key the default model is `offline`: a base URL alone would be ignored
        # without a word, and no default name fits every compatible server.
        if self.openai_base_url and self.openai_api_key is None and not self.model:
            raise ValueError(
                "OPENAI_BASE_URL is set but neither GATEWAY_MODEL nor OPENAI_API_KEY is, so the "
                "gateway would stay on its offline demo model: set GATEWAY_MODEL (--model) to a "
                "model the server at OPENAI_BASE_URL serves (no key is needed for a server that "
                "asks for none), or GATEWAY_MODEL=offline to keep the offline model"
            )
        return self

    @model_validator(mode="after")
    def _metrics_listener(self) -> Settings:
        if self.metrics_port is not None and self.workers > 1:
            # Every worker would bind it; one worker's scrape already adds all of them up
            # (docs/operations.md "Several processes").
            raise ValueError(
                "GATEWAY_METRICS_PORT cannot be used with GATEWAY_WORKERS above 1: scrape "
                "GET /metrics on the gateway's port, which any worker answers for all"
            )
        return self

    @model_validator(mode="after")
    def _webhooks_are_signed(self) -> Settings:
        if not self.webhook_url:
            return self
        if self.webhook_secret is None:
            raise ValueError(
                "GATEWAY_WEBHOOK_URL is set, so GATEWAY_WEBHOOK_SECRET must be too (the key "
                "receivers verify each webhook's signature with)"
            )
        if len(self.webhook_secret.get_secret_value()) < MIN_WEBHOOK_SECRET_CHARS:
            raise ValueError(
                f"GATEWAY_WEBHOOK_SECRET must be at least {MIN_WEBHOOK_SECRET_CHARS} characters"
            )
        if not self.webhook_allow_link_local:
            for url in self.webhook_url:
                host = urlsplit(url).hostname or ""
                if forbidden_host(host):
                    raise ValueError(
                        f"GATEWAY_WEBHOOK_URL names {host}, a link-local or cloud metadata "
                        "address: set GATEWAY_WEBHOOK_ALLOW_LINK_LOCAL=true if a receiver "
                        "really lives there"
                    )
        return self

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

    def resolved_instance_id(self) -> str:
        if self.instance_id:
            return self.instance_id
        if self.port == 0:
            # An ephemeral port names no stable instance: never mistake a peer for ourselves.
            return f"{socket.gethostname()}:ephemeral-{secrets.token_hex(4)}"
        return f"{socket.gethostname()}:{self.port}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_settings(**overrides: object) -> Settings:
    """Build settings from the environment plus explicit overrides (CLI flags, tests)."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            location = error.get("loc") or ()
            field = str(location[0]) if location else ""
            variable = _variable_name(field)
            problems.append(f"{variable}: {error['msg']}")
        raise SettingsError("invalid configuration: " + "; ".join(problems)) from None


def environment_variable(name: str) -> str:
    """The variable setting `name` is read from."""
    alias = Settings.model_fields[name].validation_alias
    return alias if isinstance(alias, str) else ENV_PREFIX + name.upper()


def _variable_name(field: str) -> str:
    # A field read under an alias is reported under it (the name the error carries).
    if field in Settings.model_fields:
        return environment_variable(field)
    return field or "configuration"
