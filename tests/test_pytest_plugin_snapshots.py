"""Issue 35, item 7, with pytest's `pytester`: a snapshot does not depend on where the model was
built (before or inside `with hook_order(model):`), stale snapshots are listed on --hooktrace-update
and removed on --hooktrace-remove-stale, and a test can leave PyTorch's saved-tensor hooks out."""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_pytest_plugin import PLUGIN, torch_imported_first  # noqa: F401  (the autouse fixture)

pytest_plugins = ["pytester"]

WHERE = """
import os

import torch

ORDER = []

def guard(module, args):
    ORDER.append("guard")

def log(module, args):
    ORDER.append("log")

def make(hooks):
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    for name, prepend in hooks:
        model[0].register_forward_pre_hook(globals()[name], prepend=prepend)
    return model

def test_lone(hook_order):
    hooks = [("guard", True)]
    if os.environ.get("BUILT_INSIDE"):
        with hook_order() as session:
            model = make(hooks)
            model(torch.randn(2, 3))
    else:
        model = make(hooks)
        with hook_order(model) as session:
            model(torch.randn(2, 3))
    assert ORDER == ["guard"]

def test_shown(hook_order):
    ORDER.clear()
    hooks = [("log", False), ("guard", True)]  # guard goes in front of log: the order shows it
    if os.environ.get("BUILT_INSIDE"):
        with hook_order() as session:
            model = make(hooks)
            model(torch.randn(2, 3))
    else:
        model = make(hooks)
        with hook_order(model) as session:
            model(torch.randn(2, 3))
    assert ORDER == ["guard", "log"]
"""


def snapshot(root: Path, name: str) -> list[str]:
    text = (root / "__hooktrace__" / "test_where" / f"{name}.txt").read_text(encoding="utf-8")
    return [" ".join(line.split()) for line in text.splitlines()[2:]]


@pytest.mark.parametrize("first", ["before", "inside"])
def test_the_snapshot_is_the_same_wherever_the_model_was_built(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    pytester.makepyfile(test_where=WHERE)
    if first == "inside":
        monkeypatch.setenv("BUILT_INSIDE", "1")
    pytester.runpytest(*PLUGIN, "--hooktrace-update").assert_outcomes(passed=2)
    assert snapshot(pytester.path, "test_lone") == ["# step 0 · forward", "0 forward 0 forward_pre guard"]
    assert snapshot(pytester.path, "test_shown") == [
        "# step 0 · forward",
        "0 forward 0 forward_pre guard [prepend]",
        "0 forward 0 forward_pre log",
    ]
    # moved across the block, the model gives the same snapshot: the test still passes
    monkeypatch.setenv("BUILT_INSIDE", "" if first == "inside" else "1")
    pytester.runpytest(*PLUGIN).assert_outcomes(passed=2)


def test_stale_snapshots_are_listed_then_removed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_where=WHERE)
    pytester.runpytest(*PLUGIN, "--hooktrace-update").assert_outcomes(passed=2)
    folder = pytester.path / "__hooktrace__" / "test_where"
    pytester.makepyfile(test_where=WHERE.replace("def test_lone", "def test_renamed"))
    result = pytester.runpytest(*PLUGIN, "--hooktrace-update")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "hooktrace: 1 snapshot(s) stale (of no collected test):",
            "  __hooktrace__/test_where/test_lone.txt",
            "  (pytest --hooktrace-remove-stale removes them)",
        ]
    )
    assert (folder / "test_lone.txt").exists()
    # a deselected test's snapshot is not stale
    result = pytester.runpytest(*PLUGIN, "--hooktrace-update", "-k", "test_shown")
    assert "test_renamed.txt" not in result.stdout.str() and "test_lone.txt" in result.stdout.str()
    result = pytester.runpytest(*PLUGIN, "--hooktrace-remove-stale")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["hooktrace: 1 snapshot(s) removed:", "  __hooktrace__/test_where/test_lone.txt"]
    )
    assert sorted(p.name for p in folder.iterdir()) == ["test_renamed.txt", "test_shown.txt"]
    assert "snapshot(s) stale" not in pytester.runpytest(*PLUGIN, "--hooktrace-update").stdout.str()


CHECKPOINTED = """
import torch
from torch.utils.checkpoint import checkpoint

def log(module, args, out):
    return None

def test_checkpointed(hook_order):
    block = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.GELU())
    block[0].register_forward_hook(log)
    x = torch.randn(2, 3, requires_grad=True)
    with hook_order(block, torch_saved_tensors=False) as session:
        checkpoint(block, x, use_reentrant=False).sum().backward()
    assert any(h.scope == "saved_tensors" for h in session.trace.hooks)  # the session keeps them
"""


def test_a_test_can_leave_out_pytorchs_saved_tensor_hooks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_ckpt=CHECKPOINTED)
    # in a process of its own: checkpoint's imports cannot be dropped and imported again in this one
    pytester.runpytest_subprocess(*PLUGIN, "--hooktrace-update").assert_outcomes(passed=1)
    text = (pytester.path / "__hooktrace__" / "test_ckpt" / "test_checkpointed.txt").read_text(
        encoding="utf-8"
    )
    assert "pack" not in text and "log" in text
    assert [line.split()[1] for line in text.splitlines() if line[:1].isdigit()] == ["forward", "recompute"]
