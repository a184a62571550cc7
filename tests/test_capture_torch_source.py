"""The capture rewrites PyTorch's source: a torch whose source does not match is refused, loudly.

Each rewrite is checked when it is made. A mismatch (forced here by replacing the source getter)
gives one UnsupportedTorch naming the torch version and the supported range; the CLI prints one
`error:` line and exits 2; nothing of hooktrace is left installed.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.capture import optim, views
from hooktrace.capture.ledger import CURRENT
from hooktrace.cli import main

from .test_cli import write


def _patched_source(change: Callable[[str, list[str]], list[str]]) -> Callable[[Any], tuple[list[str], int]]:
    def source(fn: Any) -> tuple[list[str], int]:
        lines, first = inspect.getsourcelines(fn)
        return change(fn.__qualname__, lines), first

    return source


def _drop_forward_hook_reads(name: str, lines: list[str]) -> list[str]:
    # as if a new torch read the forward hooks some other way: the rewrite cannot see them
    return [
        line.replace("self._forward_hooks.items()", 'getattr(self, "_forward_hooks").items()')
        for line in lines
    ]


def _change_one_of_two_reads(name: str, lines: list[str]) -> list[str]:
    # `_call_impl` reads the forward hooks twice (the second time for always_call hooks after an
    # exception): a torch that changes one of them still has a read of each dict, and would trace
    # half of the calls if the other namings of the dict were not checked too
    read = "self._forward_hooks.items()"
    at = (
        next((i for i, line in enumerate(lines) if read in line), None)
        if name.endswith("_call_impl")
        else None
    )
    if at is None:
        return lines
    assert sum(read in line for line in lines) >= 2  # still true of the torch this runs on
    return [*lines[:at], lines[at].replace(read, "dict(self._forward_hooks).items()", 1), *lines[at + 1 :]]


def _iterate_a_dict(name: str, lines: list[str]) -> list[str]:
    # hooks looked up by id, past the view: `(i, self._forward_pre_hooks[i]) for i in ...`
    old = "*self._forward_pre_hooks.items(),"
    new = "*((i, self._forward_pre_hooks[i]) for i in self._forward_pre_hooks),"
    return [line.replace(old, new) for line in lines]


def _rename_output_hook(name: str, lines: list[str]) -> list[str]:
    return [
        line.replace("bw_hook.setup_output_hook(result)", "bw_hook.setup_output(result)") for line in lines
    ]


def _no_step_mark(name: str, lines: list[str]) -> list[str]:
    return [
        line.replace("record_function(profile_name)", "record_function(name=profile_name)") for line in lines
    ]


@pytest.fixture
def fresh_copies(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[str, list[str]], list[str]]], None]:
    """Copies made again from a changed source (and the good ones again after the test)."""
    monkeypatch.setattr(views, "_made", None)
    monkeypatch.setattr(optim, "_made", None)

    def use(change: Callable[[str, list[str]], list[str]]) -> None:
        monkeypatch.setattr(views, "_source", _patched_source(change))

    return use


def _class_state() -> dict:
    return {**vars(nn.Module), **{("opt", k): v for k, v in vars(torch.optim.Optimizer).items()}}


@pytest.mark.parametrize(
    "change, words",
    [
        (_drop_forward_hook_reads, "no read of _forward_hooks"),
        (_change_one_of_two_reads, "_call_impl uses self._forward_hooks in a way hooktrace cannot rewrite"),
        (_iterate_a_dict, "uses self._forward_pre_hooks in a way hooktrace cannot rewrite"),
        (_rename_output_hook, "does not match the rewrite"),
        (_no_step_mark, "does not match the rewrite"),
    ],
    ids=["read", "one-of-two-reads", "other-naming", "edit", "optimizer"],
)
def test_a_mismatching_source_is_refused_with_the_version_and_range(fresh_copies, change, words):
    before = _class_state()
    fresh_copies(change)
    m = nn.Linear(2, 2)
    with pytest.raises(views.UnsupportedTorch) as info:
        with hooktrace.trace(m):
            m(torch.ones(2))
    message = str(info.value)
    assert words in message
    assert message.startswith(
        f"hooktrace supports torch {views.SUPPORTED_TORCH}; this is {torch.__version__} ("
    )
    assert _class_state() == before  # nothing installed stays
    assert all(getattr(CURRENT, slot) is None for slot in CURRENT.__slots__)  # no capture's place held


def test_the_source_as_installed_passes_every_check(fresh_copies):
    fresh_copies(lambda name, lines: lines)  # the real source, through the same getter
    m = nn.Linear(2, 2)
    seen = []
    m.register_forward_hook(lambda *a: seen.append(1))
    with hooktrace.trace(m) as t:
        m(torch.ones(2))
    assert seen == [1] and [e.type for e in t.trace.events] == ["enter", "hook", "exit"]


def _tracing_test_of_torch_2_15(name: str, lines: list[str]) -> list[str]:
    # torch 2.15's `_call_impl` tests `torch._C._is_tracing()` where 2.8 to 2.14 test `_get_tracing_state()`
    old = "torch._C._get_tracing_state() else self.forward"
    return [line.replace(old, "torch._C._is_tracing() else self.forward") for line in lines]


def test_torch_2_15s_call_impl_is_rewritten_and_an_instance_forward_traced(fresh_copies):
    fresh_copies(_tracing_test_of_torch_2_15)
    assert "torch._C._is_tracing() else" in "".join(views._source(nn.Module._call_impl)[0])
    m = nn.Linear(2, 2)
    ran = []

    def own_forward(x: torch.Tensor) -> torch.Tensor:  # set on the instance: traced through the rewrite
        ran.append("forward")
        return x

    m.forward = own_forward
    m.register_forward_hook(lambda *a: ran.append("hook"))
    with hooktrace.trace(m) as t:
        m(torch.ones(2))
    assert ran == ["forward", "hook"]
    # the instance's forward is traced (a forward wrapper), then the hook
    assert [e.type for e in t.trace.events] == ["enter", "hook", "hook", "exit"]
    assert "own_forward" in t.trace.hook(next(t.trace.hook_events()).hook).name


def test_cli_says_one_error_line_and_exits_2(
    fresh_copies, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    fresh_copies(_drop_forward_hook_reads)
    target = write(
        tmp_path / "model.py",
        "import torch\n\ndef make():\n    return torch.nn.Linear(2, 2), torch.ones(1, 2)\n",
    )
    code = main(["run", str(target)])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err
    assert len(lines) == 1
    assert lines[0].startswith(f"error: hooktrace supports torch 2.8–2.15; this is {torch.__version__} (")
