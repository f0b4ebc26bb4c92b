"""The docs stay inside the repository: every relative link resolves, and the
architecture page stays a page."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# [text](target) outside code spans; a target up to the first space or ")".
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = CODE.sub("", path.read_text(encoding="utf-8"))
    return {_anchor(m) for m in re.findall(r"^#+\s+(.*)$", text, re.MULTILINE)}


def _relative_links(path: Path) -> list[str]:
    text = CODE.sub("", path.read_text(encoding="utf-8"))
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in _relative_links(doc):
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: broken links {broken}"


def test_nothing_points_outside_the_repository() -> None:
    for doc in DOCS:
        assert "shared/ARCHITECTURE.md" not in doc.read_text(encoding="utf-8"), doc


def test_architecture_page_is_a_page() -> None:
    lines = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 260


def test_every_decision_record_has_its_parts() -> None:
    records = sorted((ROOT / "docs" / "decisions").glob("[0-9][0-9][0-9]-*.md"))
    assert records
    for record in records:
        text = record.read_text(encoding="utf-8")
        for part in ("**Context.**", "**Decision.**", "**Measurements.**"):
            assert part in text, f"{record.name} lacks {part}"


def test_benchmarks_page_is_generated_from_the_results() -> None:
    spec = importlib.util.spec_from_file_location("bench_table", ROOT / "benchmarks" / "table.py")
    assert spec and spec.loader
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert page == table.render(), "docs/benchmarks.md is out of date: run benchmarks/table.py"
    assert len(page.splitlines()) <= 300
