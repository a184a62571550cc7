"""The README's examples run, so the README cannot go stale (issue 26, item 7):

- a code block marked `<!-- example -->` just above it runs as it stands: a `python` block as one
  program, a `bash` block one command a line; each in a fresh process, in an empty folder holding a
  copy of `samples/`, and each must exit 0;
- a `text` block marked `<!-- output of: COMMAND -->` is that command's real output: the command runs
  from the repository's root, and the hook lines (`#seq kind name`, in order) and the counts line
  must be the README's (times, which change from run to run, are not compared).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MARKED = re.compile(r"<!-- example -->\n```(\w+)\n(.*?)```", re.S)
OUTPUT = re.compile(r"<!-- output of: (.*?) -->\n```text\n(.*?)```", re.S)
HOOK_LINE = re.compile(r"#\d+ +[a-z_]+ +\S+")
COUNTS = re.compile(r"\d+ hooks? registered, \d+ fired, \d+ hook calls?, \d+ module calls?")
BIN = Path(sys.executable).parent  # the venv's bin: `hooktrace` and `python` of this interpreter


def readme() -> str:
    return README.read_text(encoding="utf-8")


def examples() -> list[tuple[str, str]]:
    return [(m[1], m[2]) for m in MARKED.finditer(readme())]


def outputs() -> list[tuple[str, str]]:
    return [(m[1], m[2]) for m in OUTPUT.finditer(readme())]


def _run(args: list[str], cwd: Path, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(env_extra or {}))
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )


def test_the_readme_has_examples_of_each_kind() -> None:
    kinds = {language for language, _ in examples()}
    assert {"python", "bash"} <= kinds, kinds
    assert outputs(), "no <!-- output of: ... --> block in README.md"


@pytest.mark.parametrize("index", range(len(examples())))
def test_readme_example_runs(index: int, tmp_path: Path) -> None:
    language, code = examples()[index]
    shutil.copytree(ROOT / "samples", tmp_path / "samples")
    if language == "python":
        runs = [[sys.executable, "-c", code]]
    else:
        assert language == "bash", language
        runs = [shlex.split(line, comments=True) for line in code.splitlines() if line.strip()]
    for args in runs:
        if shutil.which("dot") is None and any(a.endswith(".svg") for a in args):
            continue  # SVG needs Graphviz's dot, as the README says
        done = _run(args, tmp_path)
        shown = " ".join(args)[:200]
        assert done.returncode == 0, f"{shown}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, done.stderr
        assert "No events" not in done.stdout, f"{shown}\n{done.stdout}"


@pytest.mark.parametrize("index", range(len(outputs())))
def test_readme_output_is_the_commands(index: int) -> None:
    command, shown = outputs()[index]
    done = _run(shlex.split(command), ROOT, {"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    real = done.stdout + done.stderr
    assert HOOK_LINE.findall(real) == HOOK_LINE.findall(shown)
    assert COUNTS.findall(real) == COUNTS.findall(shown) != []
    assert real.splitlines()[0] == shown.splitlines()[0]
