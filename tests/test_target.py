"""TARGET parsing and factory loading (hooktrace/target.py)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from hooktrace.target import UsageError, load_factory, split_spec


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


# -- TARGET strings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("model.py", ("model.py", "make")),
        ("model.py:build", ("model.py", "build")),
        ("dir/model.py:Zoo.small", ("dir/model.py", "Zoo.small")),
        ("pkg.models:make_net", ("pkg.models", "make_net")),
        ("pkg.models", ("pkg.models", "make")),
        ("model.py:", ("model.py", "make")),
        ("C:\\work\\model.py", ("C:\\work\\model.py", "make")),
        ("C:\\work\\model.py:build", ("C:\\work\\model.py", "build")),
    ],
)
def test_split_spec(spec: str, expected: tuple[str, str]) -> None:
    assert split_spec(spec) == expected


@pytest.mark.parametrize("spec", ["", ":make", "model.py:1abc", "model.py:a-b", "model.py:a..b"])
def test_split_spec_rejects(spec: str) -> None:
    with pytest.raises(UsageError):
        split_spec(spec)


def test_file_folder_is_first_on_sys_path_while_loading_and_calling(tmp_path: Path) -> None:
    write(tmp_path / "helper_ht_mod.py", "WIDTH = 5\n")
    write(tmp_path / "lazy_ht_mod.py", "DEPTH = 7\n")
    target = write(
        tmp_path / "factory.py",
        """
        from torch import nn
        import helper_ht_mod

        def make():
            import lazy_ht_mod  # imported when the factory runs, not when the file loads
            return nn.Linear(helper_ht_mod.WIDTH, lazy_ht_mod.DEPTH)
        """,
    )
    before = list(sys.path)
    factory = load_factory(f"{target}:make")
    assert sys.path == before
    model = factory()
    assert sys.path == before
    assert (model.in_features, model.out_features) == (5, 7)
    assert factory.spec == f"{target}:make"


def test_dotted_name_and_default_name(tmp_path: Path) -> None:
    target = write(
        tmp_path / "zoo.py",
        """
        from torch import nn

        class Zoo:
            @staticmethod
            def small():
                return nn.Linear(2, 3)

        def make():
            return nn.Linear(4, 1)
        """,
    )
    assert load_factory(f"{target}:Zoo.small")().out_features == 3
    assert load_factory(str(target))().in_features == 4


def test_file_can_define_dataclasses(tmp_path: Path) -> None:
    # dataclasses look their module up in sys.modules while the class is created
    target = write(
        tmp_path / "dc_target.py",
        """
        from dataclasses import dataclass
        from torch import nn

        @dataclass
        class Config:
            width: int = 3

        def make():
            return nn.Linear(Config().width, 1)
        """,
    )
    assert load_factory(str(target))().in_features == 3


def test_package_module_target_from_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "ht_pkg_example" / "__init__.py", "")
    write(
        tmp_path / "ht_pkg_example" / "models.py",
        """
        from torch import nn

        def build():
            return nn.Linear(6, 2)
        """,
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "ht_pkg_example", raising=False)
    monkeypatch.delitem(sys.modules, "ht_pkg_example.models", raising=False)
    factory = load_factory("ht_pkg_example.models:build")
    assert factory().in_features == 6
    assert factory.spec == "ht_pkg_example.models:build"


@pytest.mark.parametrize(
    ("files", "spec", "words"),
    [
        ({}, "missing_file.py:make", ["file not found", "missing_file.py"]),
        ({"m.py": "def build(): pass\n"}, "m.py:make", ["no attribute 'make'", "build"]),
        ({"m.py": "class A: pass\n"}, "m.py:A.nope", ["no attribute 'nope'"]),
        ({"m.py": "make = 3\n"}, "m.py:make", ["not callable"]),
        (
            {"m.py": "from torch import nn\nmake = nn.Linear(1, 1)\n"},
            "m.py:make",
            ["model instance", "def make"],
        ),
        ({"m.py": "import no_such_package_ht\n"}, "m.py", ["ModuleNotFoundError", "no_such_package_ht"]),
        ({"m.py": "def make(:\n"}, "m.py", ["syntax error", "line 1"]),
        ({"m.py": "raise RuntimeError('at import')\n"}, "m.py", ["RuntimeError: at import"]),
        ({}, "no_such_pkg_ht.models:make", ["no module named 'no_such_pkg_ht'"]),
    ],
)
def test_load_errors_say_what_is_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict, spec: str, words: list[str]
) -> None:
    for name, text in files.items():
        write(tmp_path / name, text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "m", raising=False)
    with pytest.raises(UsageError) as info:
        load_factory(spec)
    message = str(info.value)
    for word in words:
        assert word in message
    assert "\n" not in message


def test_folder_instead_of_file(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    with pytest.raises(UsageError, match="is a folder"):
        load_factory(f"{tmp_path / 'models'}/:make")
