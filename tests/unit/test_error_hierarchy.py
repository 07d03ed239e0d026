"""Every error the project raises is a `GatewayError` (gateway/protocol/error_codes.py), and a
fault's message (code `internal`) never reaches a client (gateway/transport/client_errors.py).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from types import ModuleType

import pytest

import gateway
import persistence
from gateway.protocol.error_codes import CodedError, ErrorCode, GatewayError
from gateway.transport.client_errors import INTERNAL, client_error
from persistence.errors import StaleWrite, StorageUnavailable


def _modules() -> Iterator[ModuleType]:
    for package in (gateway, persistence):
        yield package
        for found in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            try:
                yield importlib.import_module(found.name)
            except ModuleNotFoundError as exc:
                # Only an optional dependency that is not installed (redis, opentelemetry, ...)
                # excuses a module; a missing module of the project's own is a failure.
                if exc.name is None or exc.name.split(".")[0] in ("gateway", "persistence"):
                    raise
                continue


def _exceptions() -> Iterator[type[BaseException]]:
    for module in _modules():
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == module.__name__:
                yield value


def test_every_exception_of_the_project_is_a_gateway_error() -> None:
    found = {f"{cls.__module__}.{cls.__qualname__}": cls for cls in _exceptions()}
    # The walk reached both packages' errors, the storage ones among them.
    assert {StorageUnavailable, StaleWrite, GatewayError} <= set(found.values())
    offenders = sorted(name for name, cls in found.items() if not issubclass(cls, GatewayError))
    assert not offenders, f"not a GatewayError subclass: {', '.join(offenders)}"


def test_every_coded_error_has_a_code_of_the_table() -> None:
    for cls in _exceptions():
        if issubclass(cls, CodedError):
            assert isinstance(cls.CODE, ErrorCode), cls


class _Fault(CodedError):
    """A fault of the gateway's own: code `internal` by default."""


@pytest.mark.parametrize(
    "fault",
    [
        _Fault("row 42 of thread t-secret moved on"),
        StaleWrite("run r-secret is not at checkpoint 3"),
        GatewayError(ErrorCode.INTERNAL, "a secret detail"),
    ],
)
def test_a_fault_s_message_never_reaches_the_client(fault: GatewayError) -> None:
    assert fault.code is ErrorCode.INTERNAL and fault.fault
    # None: the caller logs the fault and answers with INTERNAL, which says nothing of it.
    assert client_error(fault) is None
    assert fault.message not in INTERNAL.message
    assert (INTERNAL.code, INTERNAL.message) == (ErrorCode.INTERNAL, "internal error")


def test_a_refusal_and_a_storage_outage_reach_the_client_as_they_are() -> None:
    refused = GatewayError(ErrorCode.CONFLICT, "run already active")
    assert client_error(refused) is refused
    outage = StorageUnavailable("storage unavailable: OperationalError")
    answer = client_error(outage)
    assert answer is not None
    assert (answer.code, answer.message) == (
        ErrorCode.UNAVAILABLE,
        "storage is unavailable; nothing was changed",
    )
    assert client_error(RuntimeError("not the gateway's")) is None
