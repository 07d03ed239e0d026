"""The private or recent APIs of other packages the gateway relies on are where it expects
them. pyproject.toml bounds each of these dependencies to the versions tested; a release that
moves one of these names fails here, naming the dependency and what relies on it, rather than
deep inside a server test or in a user's install."""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import create_async_engine
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from gateway.server.connection_state import ReceivedMessages, Writable

# (dependency, module, dotted name in it, what relies on it)
NAMES = [
    (
        "uvicorn",
        "uvicorn.protocols.websockets.websockets_sansio_impl",
        "WebSocketsSansIOProtocol",
        "gateway/server/ws_guard.py subclasses it",
    ),
    (
        "uvicorn",
        "uvicorn.protocols.http.h11_impl",
        "H11Protocol",
        "gateway/server/http_guard.py subclasses it",
    ),
    (
        "uvicorn",
        "uvicorn.protocols.http.h11_impl",
        "RequestResponseCycle",
        "gateway/server/http_guard.py ends its responses",
    ),
    ("uvicorn", "uvicorn.protocols.utils", "ClientDisconnected", "gateway/server/ws_guard.py"),
    ("uvicorn", "uvicorn._types", "ASGISendEvent", "gateway/server/ws_guard.py"),
    ("uvicorn", "uvicorn.config", "LOGGING_CONFIG", "gateway/observability/log_config.py"),
    ("websockets", "websockets.frames", "Frame", "gateway/server/ws_guard.py"),
    ("websockets", "websockets.frames", "OP_TEXT", "gateway/server/ws_guard.py"),
    ("websockets", "websockets.http11", "Request", "gateway/server/ws_guard.py"),
    (
        "websockets",
        "websockets.datastructures",
        "Headers.clear",
        "gateway/server/ws_guard.py empties a handshake's headers",
    ),
    ("websockets", "websockets.protocol", "State", "gateway/server/ws_guard.py"),
    ("websockets", "websockets.exceptions", "InvalidState", "gateway/server/ws_guard.py"),
    (
        "sqlalchemy",
        "sqlalchemy.types",
        "TypeEngine._cached_bind_processor",
        "persistence/prepared.py converts parameters as SQLAlchemy would",
    ),
    (
        "sqlalchemy",
        "sqlalchemy.types",
        "TypeEngine._cached_result_processor",
        "persistence/prepared.py converts returned columns as SQLAlchemy would",
    ),
    (
        "sqlalchemy",
        "sqlalchemy.engine",
        "Connection._has_events",
        "persistence/prepared.py tells statement observers of its executions",
    ),
    (
        "sqlalchemy",
        "sqlalchemy.exc",
        "DBAPIError.instance",
        "persistence/prepared.py raises driver errors as SQLAlchemy's",
    ),
    ("openai-agents", "agents.run_state", "RunState", "checkpoints (gateway/run_lifecycle/)"),
    (
        "openai-agents",
        "agents.run_state",
        "CURRENT_SCHEMA_VERSION",
        "checkpoints record the SDK's RunState schema version",
    ),
    (
        "openai-agents",
        "agents.result",
        "RunResultStreaming.to_state",
        "gateway/run_lifecycle/execution.py checkpoints a paused run",
    ),
    (
        "openai-agents",
        "agents.extensions.memory",
        "SQLAlchemySession",
        "persistence/sessions.py subclasses it",
    ),
    (
        "openai-agents",
        "agents.extensions.memory",
        "SQLAlchemySession._serialize_item",
        "persistence/sessions.py writes items as the SDK does",
    ),
    (
        "openai-agents",
        "agents.extensions.memory",
        "SQLAlchemySession._deserialize_item",
        "persistence/sessions.py reads items as the SDK does",
    ),
    (
        "openai-agents",
        "agents.memory.session_settings",
        "resolve_session_limit",
        "persistence/sessions.py",
    ),
    (
        "openai-agents",
        "agents.models.multi_provider",
        "MultiProvider",
        "gateway/agents/model_providers.py",
    ),
    (
        "openai-agents",
        "agents.testing",
        "assistant_message",
        "the offline demo model (gateway/agents/demo/assistant.py)",
    ),
    (
        "openai-agents",
        "agents.testing",
        "function_call",
        "the offline demo model (gateway/agents/demo/assistant.py)",
    ),
]

# Methods of uvicorn's protocols the gateway's subclasses override and call up to, and the
# private state they read, set by uvicorn's own code.
UVICORN_CLASSES = {
    "uvicorn.protocols.websockets.websockets_sansio_impl.WebSocketsSansIOProtocol": (
        ["handle_connect", "send", "keepalive_timeout", "run_asgi", "connection_lost"],
        [
            "conn",
            "transport",
            "handshake_complete",
            "close_sent",
            "writable",
            "initial_response",
            "queue",
            "request",
            "response",
        ],
    ),
    "uvicorn.protocols.http.h11_impl.H11Protocol": (
        [
            "connection_made",
            "connection_lost",
            "shutdown",
            "data_received",
            "handle_events",
            "handle_websocket_upgrade",
            "on_response_complete",
            "timeout_keep_alive_handler",
        ],
        ["conn", "cycle", "transport", "timeout_keep_alive", "timeout_keep_alive_task"],
    ),
}


def moved(dependency: str, where: str, used_by: str) -> str:
    return (
        f"{dependency} no longer has {where}, which {used_by} relies on: this {dependency} "
        f"release is outside the tested range (pyproject.toml); adapt the code before allowing it"
    )


def resolve(module: str, dotted: str) -> Any:
    value: Any = importlib.import_module(module)
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize(
    ("dependency", "module", "name", "used_by"), NAMES, ids=[f"{m}.{n}" for _, m, n, _ in NAMES]
)
def test_relied_on_names_are_where_the_gateway_expects_them(
    dependency: str, module: str, name: str, used_by: str
) -> None:
    try:
        resolve(module, name)
    except (ImportError, AttributeError):
        pytest.fail(moved(dependency, f"{module}.{name}", used_by))


@pytest.mark.parametrize("path", sorted(UVICORN_CLASSES))
def test_uvicorn_protocols_have_what_the_guards_override_and_read(path: str) -> None:
    module, _, name = path.rpartition(".")
    cls = resolve(module, name)
    methods, state = UVICORN_CLASSES[path]
    source = "".join(inspect.getsource(base) for base in cls.__mro__ if base is not object)
    missing = [m for m in methods if not callable(getattr(cls, m, None))]
    missing += [
        f"self.{a}" for a in state if f"self.{a} =" not in source and f"self.{a}:" not in source
    ]
    assert not missing, moved("uvicorn", f"{path}: {', '.join(missing)}", "gateway/server/")


def test_uvicorn_asks_of_its_queue_and_event_only_what_the_lighter_state_offers() -> None:
    """gateway/server/ws_guard.py replaces the WebSocket protocol's `queue` and `writable`
    (gateway/server/connection_state.py), which have only the methods uvicorn calls."""
    source = inspect.getsource(WebSocketsSansIOProtocol)
    for attribute, replacement in (("queue", ReceivedMessages), ("writable", Writable)):
        called = set(re.findall(rf"self\.{attribute}\.(\w+)", source))
        missing = sorted(name for name in called if not hasattr(replacement, name))
        assert called and not missing, (
            f"uvicorn's WebSocket protocol calls self.{attribute}.{missing}, which "
            f"{replacement.__name__} (gateway/server/connection_state.py) lacks: this uvicorn "
            "release is outside the tested range (pyproject.toml); adapt the code before "
            "allowing it"
        )


def test_sqlalchemy_compiled_statements_have_what_prepared_reads() -> None:
    table = Table("t", MetaData(), Column("id", Integer, primary_key=True), Column("v", String))
    compiled: Any = insert(table).compile(dialect=sqlite.dialect(), column_keys=["v"])
    parts = ["positiontup", "binds", "insert_prefetch", "update_prefetch",
             "post_compile_params", "literal_execute_params", "string"]  # fmt: skip
    missing = [part for part in parts if not hasattr(compiled, part)]
    assert not missing, moved(
        "sqlalchemy", f"SQLCompiler.{', '.join(missing)}", "persistence/prepared.py"
    )


# What persistence/prepared.py runs a statement with on PostgreSQL, as SQLAlchemy's asyncpg
# cursor does: the adapter's lock, transaction and statement cache, and asyncpg's connection.
ASYNCPG_ADAPTER_METHODS = (
    "_start_transaction",
    "_prepare",
    "_check_type_cache_invalidation",
    "_handle_exception",
)
ASYNCPG_ADAPTER_STATE = ("_execute_mutex", "_transaction", "_connection")


def test_sqlalchemy_asyncpg_adapter_has_what_prepared_runs_statements_with() -> None:
    from sqlalchemy.dialects.postgresql import asyncpg as adapter_module

    adapter = adapter_module.AsyncAdapt_asyncpg_connection
    source = "".join(inspect.getsource(base) for base in adapter.__mro__ if base is not object)
    missing = [m for m in ASYNCPG_ADAPTER_METHODS if not callable(getattr(adapter, m, None))]
    missing += [f"self.{a}" for a in ASYNCPG_ADAPTER_STATE if f"self.{a} =" not in source]
    if not hasattr(adapter_module.PGDialect_asyncpg, "_invalidate_schema_cache_asof"):
        missing.append("PGDialect_asyncpg._invalidate_schema_cache_asof")
    assert not missing, moved(
        "sqlalchemy",
        f"AsyncAdapt_asyncpg_connection: {', '.join(missing)}",
        "persistence/prepared.py",
    )


async def test_the_sdk_session_keeps_its_tables_where_sessions_py_reads_them() -> None:
    from agents.extensions.memory import SQLAlchemySession

    engine = create_async_engine("sqlite+aiosqlite://")
    try:
        session = SQLAlchemySession("s", engine=engine)
        missing = [a for a in ("_messages", "_sessions", "session_settings", "session_id")
                   if not hasattr(session, a)]  # fmt: skip
        assert not missing, moved(
            "openai-agents", f"SQLAlchemySession.{', '.join(missing)}", "persistence/sessions.py"
        )
    finally:
        await engine.dispose()


# What persistence/postgres/store.py reads to tell a connection asyncpg holds a transaction
# in that SQLAlchemy's adapter does not know of (`_hidden_transaction`), and closes it with.
ASYNCPG_CONNECTION_NAMES = ("is_closed", "is_in_transaction", "terminate")


def test_asyncpg_connection_has_what_the_store_checks_pooled_connections_with() -> None:
    import asyncpg.connection

    connection = asyncpg.connection.Connection
    source = inspect.getsource(connection)
    missing = [n for n in ASYNCPG_CONNECTION_NAMES if not callable(getattr(connection, n, None))]
    if "self._top_xact = " not in source:
        missing.append("self._top_xact")
    assert not missing, moved(
        "asyncpg", f"Connection: {', '.join(missing)}", "persistence/postgres/store.py"
    )
