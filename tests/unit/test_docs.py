"""The documentation against what it documents: README's exit-code table against the classes in
``arrayjob/errors.py`` that carry the codes, and every relative link in README.md and docs/
against the files and headings it points to."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from arrayjob import errors

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# the two codes the command line sets itself, for no class of errors.py
CLI_CODES = {0: None, 130: "KeyboardInterrupt"}


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` (a whole heading line) up to the next heading of its level or higher."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = _without_code_blocks(text).splitlines()
    start = lines.index(heading) + 1
    for end in range(start, len(lines)):
        match = re.match(r"(#+) ", lines[end])
        if match and len(match.group(1)) <= level:
            return "\n".join(lines[start:end])
    return "\n".join(lines[start:])


def _section_raw(text: str, heading: str) -> str:
    """The text under a level-2 ``heading``, code blocks kept."""
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def _table(section: str) -> list[list[str]]:
    """The rows of the first Markdown table in ``section``, header and rule left out."""
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def _classes_with_codes() -> dict[str, int]:
    """The classes of errors.py that carry an exit code of their own (``RemoteJobFailed`` carries
    the remote job's, set per instance)."""
    return {name: cls.__dict__["exit_code"] for name, cls in vars(errors).items()
            if inspect.isclass(cls) and cls.__module__ == errors.__name__ and "exit_code" in cls.__dict__}


def _readme_table() -> list[tuple[int, list[str], str]]:
    rows = _table(_section((ROOT / "README.md").read_text(), "## Exit codes"))
    return [(int(code), re.findall(r"`(\w+)`", raised), meaning) for code, raised, meaning in rows]


def test_the_errors_module_holds_codes_to_check():
    # guards the test below against finding nothing: the codes 1 to 8 and 143 are carried by classes
    assert sorted(set(_classes_with_codes().values())) == [1, 2, 3, 4, 5, 6, 7, 8, 143]


def test_readme_exit_codes_are_the_classes_codes():
    carried = _classes_with_codes()
    table = _readme_table()
    codes = [code for code, _, _ in table]
    assert len(codes) == len(set(codes)), f"a code appears twice in README's table: {codes}"
    named: dict[str, int] = {}
    for code, names, _ in table:
        ours = [name for name in names if name in carried]
        others = [name for name in names if name not in carried]
        if not ours:  # a row for a code no class carries: only the command line's own
            assert code in CLI_CODES, f"README lists exit code {code}, which no class of errors.py carries"
            assert others == ([CLI_CODES[code]] if CLI_CODES[code] else []), f"row {code} names {others}"
            continue
        assert not others, f"row {code} names {others}, which are not classes of errors.py with an exit code"
        for name in ours:
            assert carried[name] == code, f"README says {name} exits {code}; errors.py says {carried[name]}"
            named[name] = code
    assert set(named) == set(carried), f"classes missing from README's table: {set(carried) - set(named)}"
    assert set(CLI_CODES) <= set(codes)


def test_readme_says_a_submitted_job_exits_with_its_own_code():
    assert "RemoteJobFailed" in _section((ROOT / "README.md").read_text(), "## Exit codes")


def test_the_detailed_exit_codes_are_the_readmes():
    detailed = _table(_section((ROOT / "docs" / "guarantees.md").read_text(), "## Exit codes"))
    assert [int(row[0]) for row in detailed] == [code for code, _, _ in _readme_table()]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors: set[str] = set()
    for line in _without_code_blocks(path.read_text()).splitlines():
        match = re.match(r"#+ (.*)", line)
        if match:
            slug, n = _slug(match.group(1)), 0
            while (slug if n == 0 else f"{slug}-{n}") in anchors:
                n += 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(path: Path) -> list[str]:
    text = re.sub(r"`[^`\n]*`", "", _without_code_blocks(path.read_text()))
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", text)
            if not re.match(r"[a-z]+:", target)]  # http:, https:, mailto: are not checked here


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_files_and_headings(doc: Path):
    broken = []
    for target in _links(doc):
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_checker_sees_links():
    readme = _links(ROOT / "README.md")
    assert "docs/using.md#the-job-spec" in readme and len(readme) >= 10
    assert _slug("On a remote cluster (Ray Jobs)") == "on-a-remote-cluster-ray-jobs"


def test_the_readme_spec_is_the_demo_config():
    import tomllib

    readme = (ROOT / "README.md").read_text()
    block = re.search(r"^```toml\n(.*?)^```", _section_raw(readme, "## A job spec"), flags=re.M | re.S)
    assert block, "README's spec section has no toml block"
    config = tomllib.loads((ROOT / "configs" / "logreg.toml").read_text())
    assert tomllib.loads(block.group(1)) == {k: v for k, v in config.items() if v}  # empty sections left out


def test_the_make_targets_the_docs_show_exist():
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    shown = set()
    for doc in DOCS:
        # in a code span, or a command line of a code block
        shown |= set(re.findall(r"(?:`|^)make ([a-z][\w-]*)", doc.read_text(), flags=re.M))
    assert shown <= targets, f"not targets of the Makefile: {sorted(shown - targets)}"
    assert {"demo", "test", "bench", "lint"} <= shown
