"""Validate JSON against the committed API documents (docs/openapi.json, docs/asyncapi.json).

Tests hold real traffic (frames a live server sent, bodies the parser accepted) against the
published schemas, so a document that drifts from the code fails a test rather than a client.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parents[2]
OPENAPI_FILE = ROOT / "docs" / "openapi.json"
ASYNCAPI_FILE = ROOT / "docs" / "asyncapi.json"


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


class Spec:
    """One API document; `errors(name, value)` checks `value` against a component schema."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self._validators: dict[str, Draft202012Validator] = {}

    @cached_property
    def schemas(self) -> dict[str, Any]:
        return dict(self.document["components"]["schemas"])

    def errors(self, schema_name: str, value: Any) -> list[str]:
        validator = self._validators.get(schema_name)
        if validator is None:
            # `#/components/...` refs resolve against the root, so the root carries them.
            root = {
                "$ref": f"#/components/schemas/{schema_name}",
                "components": self.document["components"],
            }
            validator = self._validators[schema_name] = Draft202012Validator(root)
        return [
            f"{'/'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message[:300]}"
            for error in validator.iter_errors(value)
        ]

    def server_frame_schema(self, frame_type: str) -> str:
        """The schema name of the server frame with this `type` (AsyncAPI only)."""
        messages = self.document["components"]["messages"]
        message = messages.get(f"server.{frame_type}")
        if message is None:
            raise KeyError(f"no server frame {frame_type!r} in the AsyncAPI document")
        return str(message["payload"]["$ref"].rsplit("/", 1)[1])

    def client_frame_schema(self, frame_type: str) -> str:
        messages = self.document["components"]["messages"]
        message = messages.get(f"client.{frame_type}")
        if message is None:
            raise KeyError(f"no client frame {frame_type!r} in the AsyncAPI document")
        return str(message["payload"]["$ref"].rsplit("/", 1)[1])

    def close_codes(self) -> set[int]:
        channel = self.document["channels"]["gateway"]
        return {int(entry["code"]) for entry in channel["x-close-codes"]}


def asyncapi() -> Spec:
    return Spec(load(ASYNCAPI_FILE))


def openapi() -> Spec:
    return Spec(load(OPENAPI_FILE))
