"""Every reference from the code to the project's documents resolves.

The code cites `docs/<file>.md §N` (a numbered section) and `docs/<file>.md "Heading"` (the
start of a heading's text). Both must name a file that exists and a section it has, so that a
renumbered or renamed section is caught here rather than by a confused reader. Documents that
are not in the repository are never cited.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE_DIRS = ("gateway", "persistence", "bench", "tests", "client_demo")
CODE_SUFFIXES = {".py", ".js", ".ts", ".html"}
SKIPPED_PARTS = {"node_modules", ".venv", "__pycache__"}

# A reference may wrap across lines of a docstring or a comment ("#" and "//" markers between).
WRAP = r"(?:\s|#|//|\*)*"
NUMBERED = re.compile(rf"docs/(?P<file>[\w-]+\.md){WRAP}§{WRAP}(?P<number>\d+)")
NAMED = re.compile(rf'docs/(?P<file>[\w-]+\.md),?{WRAP}"(?P<heading>[^"\n]+)"')
# Documents of the project's own design process, which users of the project do not have.
FOREIGN = re.compile(r"\bPROTOCOL(?:\.md)?\s*§|\bSDK_NOTES\b|\bDESIGN(?:\.md)?\s+\"")


def code_files() -> list[Path]:
    return sorted(
        path
        for folder in CODE_DIRS
        for path in (ROOT / folder).rglob("*")
        if path.suffix in CODE_SUFFIXES
        and not SKIPPED_PARTS.intersection(path.relative_to(ROOT).parts)
        and path.is_file()
    )


def headings(doc: Path) -> list[str]:
    return [
        line.lstrip("#").strip()
        for line in doc.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    ]


def numbered_sections(doc: Path) -> set[str]:
    return {m.group(1) for h in headings(doc) if (m := re.match(r"(\d+)\.\s", h))}


def unquoted(heading: str) -> str:
    return heading.replace("`", "")


def broken_references(text: str, where: str) -> list[str]:
    broken: list[str] = []
    for match in NUMBERED.finditer(text):
        doc = ROOT / "docs" / match["file"]
        if not doc.exists():
            broken.append(f"{where}: {match[0]!r} cites a missing file")
        elif match["number"] not in numbered_sections(doc):
            broken.append(f"{where}: {match[0]!r}: {doc.name} has no section {match['number']}")
    for match in NAMED.finditer(text):
        doc = ROOT / "docs" / match["file"]
        if not doc.exists():
            broken.append(f"{where}: {match[0]!r} cites a missing file")
        elif not any(unquoted(h).startswith(unquoted(match["heading"])) for h in headings(doc)):
            broken.append(f"{where}: {match[0]!r}: no heading of {doc.name} starts so")
    broken.extend(
        f"{where}: {m[0]!r} cites a document not in the repository" for m in FOREIGN.finditer(text)
    )
    return broken


def test_every_reference_to_the_docs_resolves() -> None:
    files = code_files()
    assert len(files) > 100  # the walk found the code
    broken = [
        problem
        for path in files
        for problem in broken_references(
            path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))
        )
    ]
    assert broken == []


def test_the_check_finds_what_it_should() -> None:
    # The patterns themselves: a wrapped reference is read, and each kind of breakage is found.
    # (Spelled in pieces so that this file's own source holds no reference to check.)
    docs = "docs" + "/"
    sample = (
        f'"""See {docs}protocol.md\n§3 and {docs}protocol.md §99, {docs}nowhere.md §1,\n'
        f'# {docs}architecture.md "SDK behaviours", {docs}architecture.md "No such heading",\n'
        f'{"PROTO"}COL §5."""\n'
    )
    problems = broken_references(sample, "sample")
    assert len(problems) == 4, problems
    assert "no section 99" in problems[0]
    assert "missing file" in problems[1]
    assert "no heading" in problems[2]
    assert "not in the repository" in problems[3]
