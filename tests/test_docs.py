"""The project's documents are its own: nothing cites a file outside the repository, and every
``docs/*.md`` a file names exists (docs/contributing.md, "Prose and details").

No database: these read the source tree only.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIPPED = (".venv", ".data", ".git")

# Design and style notes kept outside the repository; built from parts so this file does not name them.
OUTSIDE = re.compile(r"\b(?:" + "DESIGN" + "|" + "STYLE" + r")\.md\b")
# A docs/ path (not a served document such as mcpgateway/docs/WEDGE.md), and the section quoted after it.
DOCS_PATH = re.compile(r'(?<![\w/.-])docs/([\w.-]+\.md)(?:, "([^"\n]+)")?')
# A relative Markdown link to a .md file.
MD_LINK = re.compile(r"\]\(([\w./-]+\.md)(?:#[\w-]*)?\)")


def _files() -> list[Path]:
    """Every file of the repository: tracked, or new and not ignored; outside .venv, .data and .git."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    paths = []
    for name in sorted(set(filter(None, listed.split("\0")))):
        if name.split("/", 1)[0] in SKIPPED:
            continue
        path = ROOT / name
        if path.is_file() and not path.is_symlink():
            paths.append(path)
    return paths


def _text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="ignore")


FILES = _files()


def test_the_tree_is_listed() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in FILES}
    assert {"README.md", "docs/architecture.md", "docs/contributing.md", "tests/test_docs.py"} <= names


def test_no_file_cites_design_or_style_notes_outside_the_repository() -> None:
    citing = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in FILES
        for number, line in enumerate(_text(path).splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert citing == [], "cite docs/architecture.md, docs/contributing.md or docs/decisions.md instead"


def test_every_cited_docs_file_exists_and_holds_the_section_it_is_cited_for() -> None:
    missing = []
    for path in FILES:
        for match in DOCS_PATH.finditer(_text(path)):
            name, section = match.groups()
            target = ROOT / "docs" / name
            if not target.is_file():
                missing.append(f"{path.relative_to(ROOT)}: docs/{name}")
            elif section and section not in _text(target):
                missing.append(f'{path.relative_to(ROOT)}: docs/{name}, "{section}"')
    assert missing == []


@pytest.mark.parametrize("document", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))])
def test_markdown_links_to_documents_resolve(document: str) -> None:
    path = ROOT / document if document == "README.md" else ROOT / "docs" / document
    broken = [link for link in MD_LINK.findall(_text(path)) if not (path.parent / link).is_file()]
    assert broken == []


def test_readme_and_decisions_link_the_architecture_and_contributing_guides() -> None:
    readme = _text(ROOT / "README.md")
    decisions_top = _text(ROOT / "docs" / "decisions.md")[:800]
    for guide in ("architecture.md", "contributing.md"):
        assert f"(docs/{guide})" in readme
        assert f"]({guide})" in decisions_top


def test_the_sql_core_table_names_every_sql_file() -> None:
    """A database function is added to docs/architecture.md, "The SQL core", with its file."""
    architecture = _text(ROOT / "docs" / "architecture.md")
    sql_files = sorted(
        path.relative_to(ROOT).as_posix() for path in FILES if path.suffix == ".sql" and path.parent.name == "sql"
    )
    assert sql_files
    assert [name for name in sql_files if f"`{name}`" not in architecture] == []
