"""Write (or check) the settings sections of docs/configuration.md:
`python -m gateway.settings_docs [--check]`.

Each section of gateway/settings_cli.py (a group of settings, gateway/settings/) is written
between `<!-- settings: KEY -->` and `<!-- /settings -->`: a heading (the group's title), the
group's docstring, and a table made from its fields: the variable, the flag, the default and
the description. Only the sections are written; the text around them is the document's own.
`--check` exits 1 when the committed document differs from what this writes.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from gateway.protocol.error_codes import ErrorCode, GatewayError
from gateway.settings import environment_variable
from gateway.settings_cli import SECTIONS, Section, description, flag, shown_default

CONFIGURATION = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
_BLOCK = re.compile(
    r"(<!-- settings: (?P<key>[\w-]+) -->\n)(?P<table>.*?)(<!-- /settings -->)", re.S
)
ENVIRONMENT_ONLY_CELL = "*(environment only)*"


class DocumentError(GatewayError):
    """The document's markers do not match the sections."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INTERNAL, message)


def table(section: Section) -> str:
    rows = ["| variable | CLI flag | default | meaning |", "|---|---|---|---|"]
    for name in section.fields:
        given = flag(name)
        cells = (
            f"`{environment_variable(name)}`",
            f"`{given}`" if given else ENVIRONMENT_ONLY_CELL,
            shown_default(name),
            description(name),
        )
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def block(section: Section) -> str:
    """What goes between a section's markers: its heading, its group's text and its table."""
    heading = section.title[:1].upper() + section.title[1:]
    return f"### {heading}\n\n{section.text}\n\n{table(section)}"


def render(document: str) -> str:
    """`document` with every settings section rewritten from the code."""
    sections = {section.key: section for section in SECTIONS}
    found = [match["key"] for match in _BLOCK.finditer(document)]
    unknown = sorted(set(found) - set(sections))
    missing = [key for key in sections if key not in found]
    repeated = sorted({key for key in found if found.count(key) > 1})
    if unknown or missing or repeated:
        raise DocumentError(
            f"settings sections: unknown {unknown}, missing {missing}, repeated {repeated}"
        )
    return _BLOCK.sub(lambda match: match[1] + block(sections[match["key"]]) + match[4], document)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.settings_docs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only compare, write nothing")
    parser.add_argument(
        "--file", type=Path, default=CONFIGURATION, help="default: docs/configuration.md"
    )
    args = parser.parse_args(argv)
    current = args.file.read_text(encoding="utf-8")
    try:
        text = render(current)
    except DocumentError as exc:
        print(f"{args.file}: {exc}", file=sys.stderr)
        return 1
    if text == current:
        return 0
    if args.check:
        print(f"out of date: {args.file}; run `python -m gateway.settings_docs`", file=sys.stderr)
        return 1
    args.file.write_text(text, encoding="utf-8")
    print(f"wrote {args.file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
