"""The contract lives in the repository (docs/contract.md, docs/format.md, docs/surprises.md): no file
cites a document outside it, and the docs name exactly what the code does (kinds, scopes, phases,
fields, surprise rules)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

import pytest

from hooktrace import kinds, schema

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# Documents that lived beside the repository, never in it; spelled in pieces so this file is no hit.
OUTSIDE = re.compile(
    r"\b" + "SP" + r"EC\b"  # the contract's old name, with its section signs or its file name
    r"|\b" + "STY" + r"LE\.md\b"
    r"|\b" + "HEL" + r"PERS\.md\b"
    r"|\.\./" + "sha" + r"red\b"
    r"|/work/" + "sha" + r"red\b"
)
TEXT_SUFFIXES = {"", *".py .md .txt .toml .cfg .ini .yml .yaml .json .sh .js .css .html".split()}
SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", "build", "dist"}


def repository_files() -> list[Path]:
    """Tracked files and new ones git does not ignore; a plain walk where there is no git."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        return [ROOT / name for name in out.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        found = []
        for folder, dirs, files in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
            found.extend(Path(folder) / f for f in files)
        return found


def test_no_file_cites_a_document_outside_the_repository() -> None:
    hits = []
    for path in repository_files():
        if path.suffix not in TEXT_SUFFIXES or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "cites a document outside the repository (point into docs/ instead):\n" + "\n".join(hits)


def test_the_pattern_finds_what_it_must() -> None:
    """The check above cannot pass by matching nothing."""
    for cited in (
        "(SP" + "EC §4)",
        "see SP" + "EC.md",
        "../sha" + "red/STY" + "LE.md",
        "/work/sha" + "red/x",
    ):
        assert OUTSIDE.search(cited), cited
    for fine in ("SPECIAL = []", "docs/format.md", "spec", "a shared/ folder"):
        assert not OUTSIDE.search(fine), fine


def section(doc: str, heading: str) -> str:
    """The text under `heading` (a `## ` line) up to the next `## ` heading."""
    text = (DOCS / doc).read_text(encoding="utf-8")
    assert "\n" + heading + "\n" in text, f"{doc} has no heading {heading!r}"
    return text.split("\n" + heading + "\n", 1)[1].split("\n## ", 1)[0]


def table_names(text: str) -> list[str]:
    """The backticked words of a markdown table's first column (`a`, `b` in one cell: both)."""
    names = []
    for line in text.splitlines():
        if line.startswith("| `"):
            names.extend(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


def row(text: str, name: str) -> str:
    """The table row whose first cell names `name`."""
    rows = [line for line in text.splitlines() if line.startswith("| ") and f"`{name}`" in line.split("|")[1]]
    assert len(rows) == 1, f"one row for {name!r}, found {len(rows)}"
    return rows[0]


SCOPE_WORDS = {
    kinds.MODULE: r"\bmodule\b",
    kinds.GLOBAL: r"\bglobal\b",
    kinds.TENSOR: r"\btensor scope\b",
    kinds.NODE: r"\bnode\b",
    kinds.OPTIMIZER: r"\boptimizer\b",
    kinds.SAVED_TENSORS: r"\bsaved-tensors\b",
    kinds.ENGINE: r"\bengine scope\b",
}


def documented_kinds() -> dict[str, set[str]]:
    """Kind -> the scopes its heading in format.md's "Kinds" names (`**Module and global scope**`)."""
    found: dict[str, set[str]] = {}
    scopes: set[str] = set()
    # a bullet's continuation lines joined to it: "- `a`, `b`,\n  `c`: what they are" lists a, b and c
    lines = section("format.md", "## Kinds").replace("\n  ", " ").splitlines()
    for line in lines:
        if line.startswith("**"):
            heading = line.split("**")[1].lower()
            scopes = {scope for scope, word in SCOPE_WORDS.items() if re.search(word, heading)}
        elif line.startswith("- "):
            for name in re.findall(r"`([a-z_]+)`", line.split(":", 1)[0]):
                assert name not in found, f"{name} listed twice"
                found[name] = scopes
    return found


def test_every_kind_is_documented_under_its_scopes() -> None:
    documented = documented_kinds()
    assert set(documented) == set(kinds.KINDS), (
        f"in kinds.py, not in docs/format.md: {sorted(set(kinds.KINDS) - set(documented))}; "
        f"in the docs only: {sorted(set(documented) - set(kinds.KINDS))}"
    )
    for name, kind in kinds.TABLE.items():
        assert documented[name] == set(kind.scopes), name


def test_scopes_phases_and_event_types_are_the_codes() -> None:
    hook, event = section("format.md", "## HOOK"), section("format.md", "## EVENT")
    assert set(re.findall(r"`([a-z_]+)`", row(hook, "scope").split("|")[2])) == set(kinds.SCOPES)
    assert set(re.findall(r"`([a-z_]+)`", row(event, "phase").split("|")[2])) == set(kinds.PHASES)
    assert set(re.findall(r"`([a-z_]+)`", row(event, "type").split("|")[2])) == set(kinds.EVENT_TYPES)
    assert set(re.findall(r'`"([a-z]+)"`', row(hook, "prepend_source").split("|")[2])) == set(
        schema.PREPEND_SOURCES
    )


def test_hook_and_event_fields_are_the_schemas() -> None:
    assert table_names(section("format.md", "## HOOK")) == [f.name for f in schema.fields(schema.Hook)]
    # `shapes` is the optional column, described beside the columns, not in the table
    assert table_names(section("format.md", "## EVENT")) == list(schema.REQUIRED_FIELDS)
    columns = section("format.md", "## Events as columns (version 2)")
    listed = re.findall(r'"(\w+)": \[\.\.\.\]', columns.split('"tables"', 1)[0])
    assert listed == list(schema.REQUIRED_FIELDS)
    for name in schema.OPTIONAL_INDEXED:
        assert f"`{name}`" in columns
    document = section("format.md", "## The document")
    for name in [f.name for f in schema.fields(schema.Meta)] + [f.name for f in schema.fields(schema.Module)]:
        assert f"`{name}`" in document or f'"{name}"' in document, name
    record = section("format.md", "## SURPRISE")
    assert re.findall(r'"(\w+)":', record) == ["rule", "level", "message", "hooks", "events"]
    assert {f.name for f in schema.fields(schema.Surprise)} == {"rule", "level", "message", "hooks", "events"}
    assert set(re.findall(r'"(warn|info)"', record)) == set(schema.SURPRISE_LEVELS)


def emitted_rules() -> set[str]:
    """Every rule name a `Surprise(...)` in hooktrace/analysis is built with (positional or `rule=`); a
    copy of another surprise (`Surprise(s.rule, ...)`) adds none."""
    names: set[str] = set()
    for path in (ROOT / "hooktrace" / "analysis").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Surprise":
                args = [kw.value for kw in node.keywords if kw.arg == "rule"] or node.args[:1]
                if args and isinstance(args[0], ast.Attribute) and args[0].attr == "rule":
                    continue  # a copy of a surprise made elsewhere (analysis/hiding.py), its rule kept
                assert args and isinstance(args[0], ast.Constant), f"{path.name}: a rule name not spelled out"
                names.add(args[0].value)
    return names


def test_every_surprise_rule_is_documented_and_no_other() -> None:
    from hooktrace.analysis.surprises import RULES

    emitted = emitted_rules()
    assert set(RULES) <= emitted
    documented = table_names(section("surprises.md", "## The rules"))
    assert len(documented) == len(set(documented))
    assert set(documented) == emitted, (
        f"emitted, not documented: {sorted(emitted - set(documented))}; "
        f"documented, never emitted: {sorted(set(documented) - emitted)}"
    )
    # RULES runs in the table's order (find_surprises says so); `compiled` comes last
    assert [name for name in documented if name in RULES] == list(RULES)
    reserved = re.findall(r"`([a-z-]+)` \(", section("surprises.md", "## Reserved names"))
    assert reserved and not set(reserved) & emitted, "a rule that landed moves into the table"


@pytest.mark.parametrize("doc", ["contract.md", "format.md", "surprises.md"])
def test_links_between_docs_resolve(doc: str) -> None:
    text = (DOCS / doc).read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#]+\.md)", text):
        assert (DOCS / target).is_file(), f"{doc} links to {target}, which is not in docs/"
