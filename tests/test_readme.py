"""The README's examples run: every code block marked `<!-- example -->` just above it is executed
as it stands, in a fresh process in an empty folder, so the README cannot go stale."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MARKED = re.compile(r"<!-- example -->\n```(python)\n(.*?)```", re.S)


def examples() -> list[tuple[str, str]]:
    text = README.read_text(encoding="utf-8")
    return [(m[1], m[2]) for m in MARKED.finditer(text)]


def test_the_readme_has_examples() -> None:
    assert examples(), "no block marked <!-- example --> in README.md"


@pytest.mark.parametrize("index", range(len(examples())))
def test_readme_example_runs(index: int, tmp_path: Path) -> None:
    language, code = examples()[index]
    assert language == "python"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "No events" not in done.stdout, done.stdout + done.stderr
