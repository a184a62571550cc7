"""The pytest plugin (docs/contract.md, In a test suite), run by pytest's own `pytester` on small test projects: update, pass,
a changed order failing with a diff, a missing snapshot, parametrize ids as file names, xdist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hooktrace.pytest_plugin import snapshot_name

pytest_plugins = ["pytester"]

PLUGIN = ("-p", "hooktrace.pytest_plugin")  # also loaded by the entry point; naming it again is no clash

MODEL = """
import os

import torch

def pre(module, args):
    return None

def early(module, args):
    return None

def post(module, args, output):
    return None

def make(prepend=True):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    model[0].register_forward_pre_hook(pre)
    model[0].register_forward_pre_hook(early, prepend=prepend)
    model[2].register_forward_hook(post)
    if os.environ.get("EXTRA_HOOK"):
        model[2].register_forward_pre_hook(pre)
    return model
"""

TESTS = """
import os

import pytest
import torch

from hooktrace_locked_model import make

def test_model(hook_order):
    model = make(prepend=not os.environ.get("NO_PREPEND"))
    with hook_order(model):
        model(torch.randn(2, 3)).sum().backward()

@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("name", ["a/b c", "plain"])
def test_params(hook_order, width, name):
    model = make()
    with hook_order(model):
        model(torch.randn(width, 3))

class TestGroup:
    def test_in_class(self, hook_order):
        model = make()
        with hook_order(model) as session:
            model(torch.randn(1, 3))
        assert session.trace.events
"""


@pytest.fixture(autouse=True)
def torch_imported_first() -> None:
    """pytester's in-process runs drop the modules a run imported; torch cannot be imported twice."""
    import torch  # noqa: F401

    import hooktrace.capture  # noqa: F401


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(hooktrace_locked_model=MODEL, test_locked=TESTS)
    pytester.syspathinsert()
    return pytester


def snapshots(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "__hooktrace__").rglob("*") if p.is_file())


def hunks_match_the_file(message: str, path: Path) -> int:
    """Each `@@ -start,count` hunk of a failure message shows lines start.. of the snapshot file as
    they are written there (its context and `-` lines, in order); returns how many hunks. Only the
    FAILURES section counts: with CI set, pytest repeats whole messages in its short summary."""
    message = message.split("short test summary info", 1)[0]
    lines = path.read_text(encoding="utf-8").splitlines()
    found = 0
    for match in re.finditer(r"^@@ -(\d+)(?:,(\d+))? \+\S+ @@\n((?:[ +-].*\n?)*)", message, re.M):
        start, count = int(match[1]), int(match[2] or 1)
        shown = [x[1:] for x in match[3].splitlines() if x[:1] in " -"]
        assert shown == lines[start - 1 : start - 1 + count], (match[0], lines)
        found += 1
    return found


def test_update_writes_one_snapshot_per_test_then_they_pass(project: pytest.Pytester) -> None:
    result = project.runpytest(*PLUGIN, "--hooktrace-update")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["hooktrace: 6 snapshot(s) written, 0 unchanged"])
    found = snapshots(project.path)
    assert [re.sub(r"-[0-9a-f]{8}\.txt$", "-HASH.txt", f) for f in found] == [
        "__hooktrace__/test_locked/TestGroup.test_in_class-HASH.txt",  # upper case: hashed
        "__hooktrace__/test_locked/test_model.txt",
        "__hooktrace__/test_locked/test_params[a_b_c-2]-HASH.txt",  # `a/b c`: unsafe, so hashed
        "__hooktrace__/test_locked/test_params[a_b_c-4]-HASH.txt",
        "__hooktrace__/test_locked/test_params[plain-2].txt",
        "__hooktrace__/test_locked/test_params[plain-4].txt",
    ]
    result.stdout.fnmatch_lines([f"  {f}" for f in found])
    text = (project.path / "__hooktrace__/test_locked/test_model.txt").read_text(encoding="utf-8")
    assert text.splitlines()[2:] == [
        "# step 0 · forward",
        "0 forward   0            forward_pre   early [prepend]",
        "0 forward   0            forward_pre   pre",
        "0 forward   2            forward       post",
    ]
    project.runpytest(*PLUGIN).assert_outcomes(passed=6)
    again = project.runpytest(*PLUGIN, "--hooktrace-update")
    again.stdout.fnmatch_lines(["hooktrace: 0 snapshot(s) written, 6 unchanged"])


def test_a_changed_order_fails_with_the_diff(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    project.runpytest(*PLUGIN, "--hooktrace-update").assert_outcomes(passed=6)
    monkeypatch.setenv("NO_PREPEND", "1")
    result = project.runpytest(*PLUGIN, "-k", "test_model")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*hook order differs from the snapshot __hooktrace__/test_locked/test_model.txt"
            " (pytest --hooktrace-update rewrites it)",
            "*hook order differs: 2 differences (expected 3 hook calls in 1 step, got 3 in 1)",
            "*'early' moved from position 1 to 2 of 2",
            "*'early' (module hook): prepend True → False",
            "*--- __hooktrace__/test_locked/test_model.txt",
            "*+++ this run",
        ]
    )
    assert (
        "\n-0 forward   0            forward_pre   early [prepend]"
        "\n 0 forward   0            forward_pre   pre"
        "\n+0 forward   0            forward_pre   early\n"
    ) in result.stdout.str()
    snapshot = project.path / "__hooktrace__/test_locked/test_model.txt"
    assert "\n@@ -1,6 +1,6 @@\n # hooktrace order 1: step phase" in result.stdout.str()
    assert hunks_match_the_file(result.stdout.str(), snapshot) == 1
    assert "Traceback" not in result.stdout.str()
    monkeypatch.delenv("NO_PREPEND")
    monkeypatch.setenv("EXTRA_HOOK", "1")
    added = project.runpytest(*PLUGIN, "-k", "test_model")
    added.assert_outcomes(failed=1)
    added.stdout.fnmatch_lines(
        [
            "*module '2', forward_pre hooks: 'pre' fired 1× (not expected)",
            "*+0 forward   2            forward_pre   pre",
        ]
    )


def test_a_missing_snapshot_fails_and_says_how_to_write_it(project: pytest.Pytester) -> None:
    result = project.runpytest(*PLUGIN, "-k", "test_model")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*no hook-order snapshot __hooktrace__/test_locked/test_model.txt for this test: "
            "run pytest --hooktrace-update to write it, then review and commit it"
        ]
    )
    assert not (project.path / "__hooktrace__").exists()


def test_without_a_model_an_error_in_the_block_and_two_blocks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_more="""
        import pytest
        import torch

        def test_no_model(hook_order):
            model = torch.nn.Linear(2, 2)
            model.register_forward_hook(lambda *a: None)
            with hook_order():
                model(torch.randn(1, 2))

        def test_two_blocks(hook_order):
            model = torch.nn.Linear(2, 2)
            with hook_order(model):
                pass
            model.register_forward_pre_hook(lambda *a: None)
            with hook_order(model):
                model(torch.randn(1, 2))

        def test_raises(hook_order):
            model = torch.nn.Linear(2, 2)
            with pytest.raises(ValueError):
                with hook_order(model):
                    raise ValueError("in the block")
        """
    )
    pytester.runpytest(*PLUGIN, "--hooktrace-update").assert_outcomes(passed=3)
    assert snapshots(pytester.path) == [
        "__hooktrace__/test_more/test_no_model.txt",
        "__hooktrace__/test_more/test_two_blocks.2.txt",
        "__hooktrace__/test_more/test_two_blocks.txt",
    ]
    no_model = (pytester.path / "__hooktrace__/test_more/test_no_model.txt").read_text(encoding="utf-8")
    assert "forward       test_no_model.<locals>.<lambda>" in no_model
    empty = (pytester.path / "__hooktrace__/test_more/test_two_blocks.txt").read_text(encoding="utf-8")
    assert [x for x in empty.splitlines() if x and not x.startswith("#")] == []
    pytester.runpytest(*PLUGIN).assert_outcomes(passed=3)


def test_a_hand_edited_snapshot_compares_by_its_lines(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    project.runpytest(*PLUGIN, "--hooktrace-update", "-k", "test_model").assert_outcomes(passed=1)
    path = project.path / "__hooktrace__/test_locked/test_model.txt"
    header, *rest = path.read_text(encoding="utf-8").splitlines()
    lines = [x for x in rest if x and not x.startswith("#")]
    edited = [x.replace("   ", " ").replace(" ", "\t", 2) for x in lines]  # other spacing, tabs
    path.write_text(f"{header}\n# reviewed by hand\n" + "\n".join(edited) + "\n", encoding="utf-8")
    project.runpytest(*PLUGIN, "-k", "test_model").assert_outcomes(passed=1)
    monkeypatch.setenv("NO_PREPEND", "1")
    moved = project.runpytest(*PLUGIN, "-k", "test_model")
    moved.assert_outcomes(failed=1)
    assert hunks_match_the_file(moved.stdout.str(), path) == 1  # the lines as edited, numbered as there
    shown = moved.stdout.str()
    assert (
        f"\n-{edited[0]}\n" in shown
        and f"\n {edited[1]}\n+0 forward   0            forward_pre   early\n" in shown
    )
    assert "\n-# reviewed by hand\n" in shown  # the diff is to the file --hooktrace-update would write
    monkeypatch.delenv("NO_PREPEND")
    path.write_text(f"{header}\n0 forward 0 forward_pre\n", encoding="utf-8")
    broken = project.runpytest(*PLUGIN, "-k", "test_model")
    broken.assert_outcomes(failed=1)
    broken.stdout.fnmatch_lines(
        ["*is not an order file (line 2: expected step, phase, module, kind and hook*"]
    )


@pytest.mark.parametrize(
    ("nodeid", "name"),
    [
        ("tests/test_x.py::test_a", "test_a"),
        ("tests/test_x.py::test_b[1.5-x]", "test_b[1.5-x]"),
        ("tests/test_x.py::TestA::test_b[1-2]", "TestA.test_b[1-2]-"),  # upper case: hashed
        ("tests/test_x.py::testa::test_b[1-2]", "testa.test_b[1-2]"),
        ("test_x.py::test_c[a/b]", "test_c[a_b]-"),
        ("test_x.py::test_c[a_b]", "test_c[a_b]"),
        ("test_x.py::test_c[a::b]", "test_c[a__b]-"),
        ('test_x.py::test_d[ü:*?<>|"]', "test_d[________]-"),
        ("test_x.py::a.b", "a.b-"),  # not a Python test: `.` would read as a class's
        ("test_x.py::a::2", "a.2-"),  # would be test a's second block
        ("test_x.py::test_e-0123abcd", "test_e-0123abcd-"),  # would read as a hashed name
    ],
)
def test_snapshot_names_are_safe_file_names(nodeid: str, name: str) -> None:
    got = snapshot_name(nodeid)
    assert got.startswith(name) and (got == name or len(got) == len(name) + 8), got
    assert snapshot_name(nodeid) == got
    assert snapshot_name("x.py::test_" + "p" * 500).endswith(snapshot_name("x.py::test_" + "p" * 500)[-9:])
    assert len(snapshot_name("x.py::test_" + "p" * 500)) <= 130


def test_two_tests_never_share_a_snapshot_file_on_any_file_system() -> None:
    """The mapping from test to file is injective, also when case is ignored (macOS, Windows)."""
    ids = ["a::b", "a.b", "a_b", "a:b", "A.b", "a.B", "a/b", "a b", "1.5", "a.b-0123abcd", ""]
    nodeids = [f"t.py::test_p[{i}]" for i in ids] + ["t.py::test_p", "t.py::Test_p", "t.py::test_P"]
    nodeids += ["t.py::TestA::test_p", "t.py::TestA.test_p", "t.py::Testa::test_p", "t.py::test_p::2"]
    names = [snapshot_name(n) for n in nodeids]
    files = {f"{n}.txt" for n in names} | {f"{n}.{k}.txt" for n in names for k in (2, 3)}
    assert len({f.lower() for f in files}) == 3 * len(nodeids), sorted(names)


def test_parametrize_ids_that_read_alike_get_their_own_snapshots(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_p="""
        import pytest
        import torch

        @pytest.mark.parametrize("n", [1, 2, 3], ids=["a::b", "a.b", "A.b"])
        def test_p(hook_order, n):
            model = torch.nn.Linear(2, 2)
            for _ in range(n):
                model.register_forward_hook(lambda *a: None)
            with hook_order(model):
                model(torch.randn(1, 2))
        """
    )
    pytester.runpytest(*PLUGIN, "--hooktrace-update").assert_outcomes(passed=3)
    found = snapshots(pytester.path)
    assert len(found) == 3 and len({f.lower() for f in found}) == 3, found
    assert "__hooktrace__/test_p/test_p[a.b].txt" in found
    pytester.runpytest(*PLUGIN).assert_outcomes(passed=3)


def test_a_snapshot_that_is_not_an_order_file_fails_and_update_rewrites_it(project: pytest.Pytester) -> None:
    project.runpytest(*PLUGIN, "--hooktrace-update", "-k", "test_model").assert_outcomes(passed=1)
    path = project.path / "__hooktrace__/test_locked/test_model.txt"
    written = path.read_bytes()
    shown = "__hooktrace__/test_locked/test_model.txt"
    for content, why in [
        (b"\xff\xfe x", "not UTF-8 text"),
        (written.replace(b"order 1:", b"order 2:"), "line 1: order format version 2, which this hooktrace"),
        (b"", "it is empty"),
        (b"# reviewed\n" + written, "its first line is not the format line"),
    ]:
        path.write_bytes(content)
        result = project.runpytest(*PLUGIN, "-k", "test_model")
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines([f"*the snapshot {shown} is not an order file ({why}*"])
        result.stdout.fnmatch_lines(["*; rewrite it with pytest --hooktrace-update"])
        assert "Traceback" not in result.stdout.str() and "UnicodeDecodeError" not in result.stdout.str()
        update = project.runpytest(*PLUGIN, "--hooktrace-update", "-k", "test_model")
        update.assert_outcomes(passed=1)
        update.stdout.fnmatch_lines(["hooktrace: 1 snapshot(s) written, 0 unchanged"])
        assert path.read_bytes() == written
    path.unlink()
    path.mkdir()
    for args in (("--hooktrace-update",), ()):
        result = project.runpytest(*PLUGIN, *args, "-k", "test_model")
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(
            [
                f"*the snapshot path {shown} is a folder, not a file: remove it, then run pytest --hooktrace-update"
            ]
        )
        assert "Traceback" not in result.stdout.str() and "IsADirectoryError" not in result.stdout.str()


def test_with_plugin_autoload_disabled_p_enables_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the README says: PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 skips the entry point; `-p` loads it."""
    pytester.makepyfile(
        test_off="""
        def test_nothing_traced(hook_order):
            with hook_order():
                pass
        """
    )
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    off = pytester.runpytest()
    off.assert_outcomes(errors=1)
    off.stdout.fnmatch_lines(["*fixture 'hook_order' not found*"])
    pytester.runpytest(*PLUGIN, "--hooktrace-update").assert_outcomes(passed=1)
    assert snapshots(pytester.path) == ["__hooktrace__/test_off/test_nothing_traced.txt"]
    pytester.runpytest(*PLUGIN).assert_outcomes(passed=1)


def test_loading_the_plugin_imports_neither_torch_nor_hooktrace_s_capture() -> None:
    code = (
        "import sys, pytest\n"
        "import hooktrace.pytest_plugin\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'hooktrace.capture' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_entry_point_is_declared_and_installed() -> None:
    from importlib.metadata import entry_points

    pyproject = (Path(__file__).parent.parent / "pyproject.toml").read_text(encoding="utf-8")
    assert "[project.entry-points.pytest11]\n" in pyproject
    assert '"hooktrace.pytest_plugin" = "hooktrace.pytest_plugin"' in pyproject
    installed = [e.value for e in entry_points(group="pytest11")]
    if "hooktrace.pytest_plugin" not in installed:
        pytest.skip("this environment's hooktrace was installed before the entry point: pip install -e .")


@pytest.mark.slow  # two worker processes import torch: about a minute on this VM
def test_safe_under_xdist(project: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    project.runpytest_subprocess(*PLUGIN, "-p", "xdist", "-n", "2", "--hooktrace-update").assert_outcomes(
        passed=6
    )
    assert len(snapshots(project.path)) == 6
    assert not list(project.path.rglob("*.tmp*"))
    project.runpytest_subprocess(*PLUGIN, "-p", "xdist", "-n", "2").assert_outcomes(passed=6)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("0 forward   0            forward_pre   pre #99999999999", "the occurrence must be #2 to #100000"),
        ("\u00b2 forward   0            forward_pre   pre", "the step must be a number of at most 12 digits"),
        ("0 forward   0            forward_pre   pre #\u00b2", "the occurrence must be #2 to #100000"),
        ("9" * 5000 + " forward   0            forward_pre   pre", "the step must be a number of at most 12"),
    ],
)
def test_a_snapshot_with_unbounded_numbers_fails_as_not_an_order_file(
    project: pytest.Pytester, line, why
) -> None:
    """A number read from the file is bounded: no memory without end for `#99999999999` (a never-fired
    stand-in per unwritten occurrence), no internal ValueError for `²` or 5,000 digits."""
    project.runpytest(*PLUGIN, "--hooktrace-update", "-k", "test_model").assert_outcomes(passed=1)
    path = project.path / "__hooktrace__/test_locked/test_model.txt"
    path.write_text(path.read_text(encoding="utf-8") + line + "\n", encoding="utf-8")
    result = project.runpytest(*PLUGIN, "-k", "test_model")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [f"*the snapshot __hooktrace__/test_locked/test_model.txt is not an order file (*{why}*"]
    )
    assert "Traceback" not in result.stdout.str() and "ValueError" not in result.stdout.str()


def test_a_snapshot_that_is_a_symbolic_link_is_refused(project: pytest.Pytester, tmp_path: Path) -> None:
    """Written through, a link would overwrite a file outside the tests: refused as a FIFO is."""
    project.runpytest(*PLUGIN, "--hooktrace-update", "-k", "test_model").assert_outcomes(passed=1)
    path = project.path / "__hooktrace__/test_locked/test_model.txt"
    outside = tmp_path / "precious.txt"
    outside.write_bytes(path.read_bytes().replace(b"pre", b"other"))
    kept = outside.read_bytes()
    path.unlink()
    path.symlink_to(outside)
    for args in (("--hooktrace-update",), ()):
        result = project.runpytest(*PLUGIN, *args, "-k", "test_model")
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(
            ["*the snapshot path __hooktrace__/test_locked/test_model.txt is a symbolic link*"]
        )
        assert outside.read_bytes() == kept and path.is_symlink()


def test_update_where_the_snapshot_cannot_be_written_is_a_clear_failure(project: pytest.Pytester) -> None:
    """A file where the snapshot folder must be, or a read-only folder: a pytest failure naming the
    snapshot, not a raw OSError."""
    import os

    folder = project.path / "__hooktrace__"
    folder.write_text("not a folder", encoding="utf-8")
    result = project.runpytest(*PLUGIN, "--hooktrace-update", "-k", "test_model")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cannot write the snapshot __hooktrace__/test_locked/test_model.txt: *"])
    assert "Traceback" not in result.stdout.str() and "FileExistsError" not in result.stdout.str()
    folder.unlink()
    if os.geteuid() == 0:  # root writes into read-only folders
        return
    (folder / "test_locked").mkdir(parents=True)
    (folder / "test_locked").chmod(0o500)
    try:
        result = project.runpytest(*PLUGIN, "--hooktrace-update", "-k", "test_model")
    finally:
        (folder / "test_locked").chmod(0o700)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cannot write the snapshot __hooktrace__/test_locked/test_model.txt: *"])
    assert "PermissionError" not in result.stdout.str()
