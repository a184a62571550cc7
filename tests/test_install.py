"""The user's install (issue 26, item 1): what pyproject.toml promises agrees with torch and the README.

.ci/run installs the wheel into a fresh environment; these checks need no network and no new venv."""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def test_requires_python_is_torchs_and_the_readmes() -> None:
    ours = project()["requires-python"]
    # never a Python that the installed torch's wheels do not support (torch 2.13 and later: 3.10,
    # as hooktrace; torch 2.8 to 2.12 also 3.9, which hooktrace does not support)
    theirs = re.match(r">=(\d+)\.(\d+)", md.metadata("torch")["Requires-Python"])
    major_minor = re.fullmatch(r">=(\d+\.\d+)", ours)[1]
    assert tuple(map(int, major_minor.split("."))) >= tuple(map(int, theirs.groups()))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"Python {major_minor} or newer" in readme
    assert not re.search(r"Python 3\.\d+ or newer", readme.replace(f"Python {major_minor} or newer", ""))


def test_the_runtime_dependencies_hold_no_test_tools() -> None:
    runtime = {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].lower() for d in project()["dependencies"]}
    dev = {
        re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].lower() for d in project()["optional-dependencies"]["dev"]
    }
    assert "torch" in runtime and not runtime & dev
    assert {"pytest", "hypothesis", "ruff", "build"} <= dev


def test_the_readme_puts_the_users_install_before_the_developers() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    user, dev = readme.index("\n## Install into your own environment"), readme.index("\n## Set-up")
    assert user < dev
    section = readme[user : readme.index("\n## ", user + 1)]
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in section
    assert "CUDA build" in section
