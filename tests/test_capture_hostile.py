"""Hostile arguments: a test double as a module's argument (`Mock(spec=torch.Tensor)`, whose `__class__`
says Tensor; an object whose `__class__` raises) runs traced as untraced, under `trace()`, and
`hooktrace exec`; `--shapes` describes containers and tensor subclasses without calling the
program's code (a tuple or dict subclass's `__len__`/`__iter__`/`items`, a tensor subclass's `shape`).

Every hook logs its own label as it runs; hooktrace's order must equal that log.
"""

from __future__ import annotations

import sys
import textwrap
from typing import Any
from unittest import mock

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.cli import main


class _ClassRaises:
    @property  # type: ignore[misc]
    def __class__(self) -> Any:  # noqa: D105
        raise RuntimeError("no __class__ here")


class Takes(nn.Module):
    def forward(self, x: Any) -> int:
        return 7


ARGS = {
    "Mock(spec=Tensor)": lambda: mock.Mock(spec=torch.Tensor),
    "__class__ raises": _ClassRaises,
}


@pytest.mark.parametrize("arg", list(ARGS))
def test_a_test_double_as_an_argument_runs_traced_as_untraced(arg):
    log: list[str] = []
    m = Takes()
    m.register_forward_pre_hook(lambda mod, a: log.append("pre"))
    m.register_forward_hook(lambda mod, a, out: log.append("fwd"))
    double = ARGS[arg]()
    untraced = m(double)
    untraced_log = list(log)
    log.clear()
    with hooktrace.trace(m) as t:
        traced = m(double)
    assert traced == untraced == 7 and log == untraced_log == ["pre", "fwd"]
    names = {h.id: h.kind for h in t.trace.hooks}
    assert [{"forward_pre": "pre", "forward": "fwd"}[names[e.hook]] for e in t.trace.hook_events()] == log


@pytest.mark.parametrize("arg", list(ARGS))
def test_a_test_double_as_an_argument_under_exec(tmp_path, monkeypatch, capsys, arg):
    make = "mock.Mock(spec=torch.Tensor)" if arg.startswith("Mock") else "ClassRaises()"
    script = tmp_path / "double.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from unittest import mock
            import torch

            class ClassRaises:
                @property
                def __class__(self):
                    raise RuntimeError("no __class__ here")

            class Takes(torch.nn.Module):
                def forward(self, x):
                    return 7

            m = Takes()
            m.register_forward_hook(lambda mod, a, out: print("hook ran"))
            print("result", m({make}))
            """
        ),
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["hooktrace"])
    out_path = tmp_path / "t.json"
    code = main(["exec", "--step-on", "forward", "--keep-running", "-o", str(out_path), str(script)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "hook ran" in out and "result 7" in out
    trace = hooktrace.load(out_path)
    assert [e.kind for e in trace.hook_events()] == ["forward"]


# -- --shapes reads without calling the program's code ---------------------------------------------
CALLED: list[str] = []


class LoudTuple(tuple):
    def __len__(self) -> int:
        CALLED.append("tuple.__len__")
        return tuple.__len__(self)

    def __iter__(self) -> Any:
        CALLED.append("tuple.__iter__")
        return tuple.__iter__(self)

    def __getitem__(self, i: Any) -> Any:
        CALLED.append("tuple.__getitem__")
        return tuple.__getitem__(self, i)


class LoudDict(dict):
    def __len__(self) -> int:
        CALLED.append("dict.__len__")
        return dict.__len__(self)

    def __iter__(self) -> Any:
        CALLED.append("dict.__iter__")
        return dict.__iter__(self)

    def items(self) -> Any:
        CALLED.append("dict.items")
        return dict.items(self)


class LoudTensor(torch.Tensor):
    @property
    def shape(self) -> Any:
        CALLED.append("tensor.shape")
        return torch.Size([99])

    @property
    def dtype(self) -> Any:
        CALLED.append("tensor.dtype")
        return torch.float64


class Passes(nn.Module):
    def forward(self, pair: Any, named: Any, t: torch.Tensor) -> torch.Tensor:
        return t * 2


def test_shapes_reads_containers_and_tensor_subclasses_without_calling_their_code():
    log: list[str] = []
    m = Passes()
    m.register_forward_pre_hook(lambda mod, args: log.append("pre"))
    m.register_forward_hook(lambda mod, args, out: log.append("fwd"))
    pair = LoudTuple((torch.ones(2), torch.zeros(3)))
    named = LoudDict(a=torch.ones(1, 2))
    t = torch.ones(4).as_subclass(LoudTensor)
    CALLED.clear()
    m(pair, named, t)
    untraced_calls, untraced_log = list(CALLED), list(log)
    CALLED.clear()
    log.clear()
    with hooktrace.trace(m, shapes=True) as session:
        m(pair, named, t)
    assert CALLED == untraced_calls  # only what the program itself called
    assert log == untraced_log == ["pre", "fwd"]
    [pre, fwd] = session.trace.hook_events()
    assert (pre.kind, fwd.kind) == ("forward_pre", "forward")
    assert (
        pre.shapes == "(LoudTuple(f32[2] cpu, f32[3] cpu), LoudDict{a: f32[1,2] cpu}, LoudTensor f32[4] cpu)"
    )
