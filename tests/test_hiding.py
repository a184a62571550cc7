"""Issue 35, items 2-4: `--hide-library` / `--hide GLOB` leave hooks out of every rendering (the trace
file keeps them, the pictures count them); the user's line that registered a hook defined elsewhere
is shown; checkpoint's own early stop is drawn as PyTorch's stop, not as an `error`."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import hooktrace
from hooktrace.analysis.hiding import hidden_of, hide, is_library_file
from hooktrace.render import render
from hooktrace.render.tree import tree_text
from hooktrace.schema import HOOK, is_internal_error

from .test_cli import SAMPLES, invoke

CALLED: list[str] = []


def user_post(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> None:
    CALLED.append("user_post")


def traced_checkpoint() -> hooktrace.Trace:
    """A block under non-reentrant checkpoint (torch's saved-tensor hooks, its early stop) and one
    hook of the user's on the head."""
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU(), torch.nn.Linear(4, 4))
    head = torch.nn.Linear(4, 1)
    model = torch.nn.ModuleDict({"block": block, "head": head})
    head.register_forward_hook(user_post)
    CALLED.clear()
    with hooktrace.trace(model) as t:
        x = checkpoint(block, torch.randn(2, 4, requires_grad=True), use_reentrant=False)
        head(x).sum().backward()
    assert CALLED == ["user_post"]  # the record of the user's hook itself
    return t.trace


def test_hide_library_leaves_out_torchs_hooks_and_counts_them() -> None:
    trace = traced_checkpoint()
    torch_hooks = {h.id for h in trace.hooks if h.defined_at and h.defined_at.startswith("torch/")}
    assert torch_hooks, "checkpoint registers its saved-tensor hooks"
    torch_calls = sum(1 for e in trace.events if e.type == HOOK and e.hook in torch_hooks)
    shown = hide(trace, library=True)
    assert {h.id for h in shown.hooks} == {h.id for h in trace.hooks} - torch_hooks
    assert [h.name for h in shown.hooks] == ["user_post"]
    assert not any(e.hook in torch_hooks for e in shown.events if e.type == HOOK)
    # every module call stays, and the user's hook call keeps its seq
    assert [e.seq for e in shown.events if e.type != HOOK] == [e.seq for e in trace.events if e.type != HOOK]
    left_out = hidden_of(shown)
    assert left_out is not None and (left_out.hooks, left_out.calls) == (len(torch_hooks), torch_calls)
    assert hidden_of(trace) is None and len(trace.hooks) == len(torch_hooks) + 1  # the trace is unchanged
    text = tree_text(trace, width=200, hide_library=True)
    assert "pack_hook" not in text and "user_post" in text
    assert f"hidden: {torch_calls} hook calls of {len(torch_hooks)} hooks (--hide-library)" in text
    assert "hidden:" not in tree_text(trace, width=200)


def test_hide_glob_matches_names_and_defining_files() -> None:
    trace = traced_checkpoint()
    by_name = hide(trace, globs=["*unpack_hook"])
    assert not any(h.name.endswith("unpack_hook") for h in by_name.hooks)
    assert any(h.name.endswith(".pack_hook") for h in by_name.hooks)
    by_file = hide(trace, globs=["checkpoint.py"])  # a defining file's base name
    assert [h.name for h in by_file.hooks] == ["user_post"]
    assert [h.name for h in hide(trace, globs=["torch/utils/*"]).hooks] == ["user_post"]
    assert len(hide(trace, globs=["nothing*"]).hooks) == len(trace.hooks)


def test_what_is_library_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fancylib.py").write_text("x = 1\n")
    assert is_library_file("torch/utils/checkpoint.py:1155")
    assert is_library_file("numpy/core/numeric.py:10")  # an installed package
    assert is_library_file(os.path.join(sysconfig.get_paths()["stdlib"], "functools.py") + ":3")
    for user in ("train.py:90", "fancylib.py:5", "In [3]:2", "<string>:1", "/home/me/x.py:3", None):
        assert not is_library_file(user), user


@pytest.mark.parametrize("fmt", ["dot", "order", "html", "chrome"])
def test_every_rendering_leaves_the_hidden_hooks_out(tmp_path: Path, fmt: str) -> None:
    saved = tmp_path / "t.json"
    traced_checkpoint().save(saved)
    out = tmp_path / f"t.{fmt}"
    code, _, err = invoke("render", str(saved), "-f", fmt, "-o", str(out), "--hide-library")
    assert code == 0, err
    assert "pack_hook" not in out.read_text() and "user_post" in out.read_text()
    assert "hidden: " in err and "(--hide-library)" in err  # the `wrote` line counts them
    code, _, err = invoke("render", str(saved), "-f", fmt, "-o", str(out))
    assert code == 0 and "pack_hook" in out.read_text() and "hidden" not in err


def test_the_trace_file_keeps_every_hook(tmp_path: Path) -> None:
    whole, kept = tmp_path / "whole.json", tmp_path / "kept.json"
    target = str(SAMPLES / "saved_tensors.py")
    assert invoke("run", target, "-o", str(whole))[0] == 0
    code, _, err = invoke("run", target, "-o", str(kept), "--hide-library", "--hide", "*")
    assert code == 0 and "note: --hide-library, --hide not applied to json output" in err
    assert len(hooktrace.load(kept).hooks) == len(hooktrace.load(whole).hooks) > 0
    code, out, _ = invoke("run", target, "--hide-library")
    assert code == 0 and "(--hide-library)" in out and "hidden: " in out


def test_the_user_line_that_registered_a_hook_defined_elsewhere_is_shown() -> None:
    trace = traced_checkpoint()
    pack = next(h for h in trace.hooks if h.name.endswith(".pack_hook"))
    assert pack.registered_by is not None and pack.registered_by.endswith(
        f"{Path(__file__).name}:{_line('x = checkpoint')}"
    )
    text = tree_text(trace, width=300, expand=True)
    pack_lines = [line for line in text.splitlines() if ".pack_hook" in line]
    assert any(f"registered by {pack.registered_by}" in line for line in pack_lines)
    by = {h.registered_by for h in trace.hooks if h.name.endswith("pack_hook")}
    assert by <= {f"tests/{Path(__file__).name}:{_line(s)}" for s in ("x = checkpoint", "head(x)")}, by
    assert all(any(f"registered by {b}" in line for b in by) for line in pack_lines)
    user_line = next(line for line in text.splitlines() if "user_post" in line)
    assert "registered by" not in user_line  # defined and registered in the same file: nothing to add


def _line(text: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip().startswith(text))


def test_checkpoints_early_stop_is_not_drawn_as_an_error() -> None:
    trace = traced_checkpoint()
    stops = [e for e in trace.events if e.type == HOOK and is_internal_error(e.error)]
    assert stops, "PyTorch's checkpoint stopped its recompute inside a pack hook"
    text = tree_text(trace, width=300, expand=True)
    assert "stopped by PyTorch: _StopRecomputationError" in text
    assert "error: _Stop" not in text and ", error]" not in text and "[error]" not in text
    dot = str(render(trace, "dot", expand=True))
    assert "error: _Stop" not in dot and "stopped by PyTorch: _StopRecomputationError" in dot


def test_a_users_file_is_no_library_when_a_namesake_is_on_sys_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # another folder's train.py on sys.path (a script run earlier in the process) made the user's
    # train.py an "installed package" and so hidden by --hide-library
    elsewhere, here = tmp_path / "elsewhere", tmp_path / "here"
    for folder in (elsewhere, here):
        folder.mkdir()
        (folder / "train.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(elsewhere))
    monkeypatch.chdir(here)
    assert not is_library_file("train.py:90")
    assert is_library_file("torch/utils/checkpoint.py:1155")
