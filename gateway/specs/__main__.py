"""Write (or check) the committed API documents: `python -m gateway.specs [--check]`.

docs/openapi.json and docs/asyncapi.json are this package's output, and so are the error-code
and close-code tables of docs/protocol.md; all are committed so they can be read and diffed
without running anything. `--check` exits 1 when any of them is out of date.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.specs.asyncapi import asyncapi_document
from gateway.specs.openapi import openapi_document
from gateway.specs.protocol_tables import with_tables

DOCS = Path(__file__).resolve().parents[2] / "docs"
# The prose reference, whose §7 tables are generated (`gateway.specs.protocol_tables`).
PROTOCOL = "protocol.md"


def documents() -> dict[str, Callable[[], dict[str, Any]]]:
    return {"openapi.json": openapi_document, "asyncapi.json": asyncapi_document}


def render(document: dict[str, Any]) -> str:
    # Indented and in insertion order, so a change to the API reads as a small diff.
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def outputs(out: Path) -> dict[str, str]:
    """File name -> what it should hold. docs/protocol.md is prose with generated tables: the
    copy in `out` is updated, or docs/'s own when `out` has none."""
    texts = {name: render(build()) for name, build in documents().items()}
    prose = out / PROTOCOL if (out / PROTOCOL).exists() else DOCS / PROTOCOL
    texts[PROTOCOL] = with_tables(prose.read_text(encoding="utf-8"))
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.specs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only compare, write nothing")
    parser.add_argument("--out", type=Path, default=DOCS, help="directory (default: docs/)")
    args = parser.parse_args(argv)
    stale = []
    for name, text in outputs(args.out).items():
        path = args.out / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run `python -m gateway.specs`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
