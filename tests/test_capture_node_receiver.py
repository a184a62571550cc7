"""A node hook's node is found without running user code again (the observer promise).

The registering line's receiver (`holder.node.register_hook(h)`) is read again only where reading
runs no code; a property, `__getattr__` or a tensor subclass's `__torch_function__` on the way runs
exactly as often traced as untraced, and the hook is then listed without its node's owner.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace

from .training_hooks import Log


class Holder:
    def __init__(self, y: torch.Tensor) -> None:
        self._y = y
        self.reads = 0

    @property
    def node(self) -> Any:
        self.reads += 1
        return self._y.grad_fn


class Counted(torch.Tensor):
    calls = 0

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        Counted.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def _property_run(traced: bool) -> tuple[int, Log, Any]:
    L = Log()
    x = torch.ones(2, requires_grad=True)
    with hooktrace.trace() if traced else nullcontext() as t:
        holder = Holder(x * 3)
        holder.node.register_hook(L.fn("post"))
        holder.node.register_prehook(L.fn("pre"))
        holder._y.sum().backward()
    return holder.reads, L, t


def test_a_property_on_the_receiver_runs_once_traced_as_untraced():
    reads, plain, _ = _property_run(False)
    assert reads == 2 and plain.log == ["pre", "post"]
    traced_reads, L, t = _property_run(True)
    assert traced_reads == reads
    assert L.log == plain.log and L.traced(t.trace) == L.log
    kinds = {h.name: h.kind for h in t.trace.hooks}
    assert kinds == {"hook_post": "node", "hook_pre": "node_pre"}  # the method name still tells the kind


def _subclass_run(traced: bool) -> tuple[int, list[str]]:
    L = Log()
    x = torch.ones(2, requires_grad=True)
    y = (x * 2).as_subclass(Counted)
    Counted.calls = 0
    with hooktrace.trace() if traced else nullcontext():
        y.grad_fn.register_hook(L.fn("post"))
    return Counted.calls, L.log


def test_a_torch_function_subclass_receiver_is_not_read_again():
    calls, _ = _subclass_run(False)
    assert calls >= 1  # reading grad_fn went through __torch_function__: the oracle itself
    assert _subclass_run(True)[0] == calls


@pytest.mark.parametrize("traced", [False, True])
def test_plain_receivers_still_name_the_parameter(traced):
    """The nearest case: a chain of C getters and tuple items is read again, and names the node."""
    torch.manual_seed(0)
    m = nn.Linear(2, 1)
    L = Log()
    with hooktrace.trace(m) if traced else nullcontext() as t:
        y = m(torch.ones(1, 2))
        y.grad_fn.next_functions[2][0].next_functions[0][0].register_hook(L.fn("acc"))
        y.sum().backward()
    assert L.log == ["acc"]
    if traced:
        [hook] = [h for h in t.trace.hooks if h.name == "hook_acc"]
        assert hook.kind == "node" and hook.tensor == "weight"


class _Counting(type):
    """A metaclass whose `__getattr__` counts: looking a missing name up on the class runs it."""

    lookups = 0

    def __getattr__(cls, name: str) -> Any:
        _Counting.lookups += 1
        raise AttributeError(name)


class Masked(metaclass=_Counting):
    """Holds a node in a plain attribute, but `__class__` is a property (as mocks and proxies have):
    `isinstance(obj, X)` reads it when the type check fails."""

    def __init__(self, node: Any) -> None:
        self.n = node
        self.class_reads = 0

    @property
    def __class__(self) -> type:  # type: ignore[override]
        self.class_reads += 1
        return Masked


class Outer:
    def __init__(self, m: Masked) -> None:
        self.m = m


def _masked_run(traced: bool) -> tuple[int, int, list[str], Any]:
    L = Log()
    x = torch.ones(2, requires_grad=True)
    _Counting.lookups = 0
    with hooktrace.trace() if traced else nullcontext() as t:
        y = x * 3
        holder = Masked(y.grad_fn)
        outer = Outer(holder)
        outer.m.n.register_hook(L.fn("post"))
        y.sum().backward()
    return holder.class_reads, _Counting.lookups, L.log, t


def test_a_class_property_or_metaclass_getattr_on_the_receiver_never_runs():
    """Reading `outer.m.n` again must not ask `m.__class__` (isinstance would) or the metaclass of
    `m`'s class (hasattr on the class would)."""
    reads, lookups, plain, _ = _masked_run(False)
    assert (reads, lookups, plain) == (0, 0, ["post"])
    reads, lookups, traced, t = _masked_run(True)
    assert (reads, lookups, traced) == (0, 0, ["post"])
    [hook] = [h for h in t.trace.hooks if h.name == "hook_post"]
    assert hook.kind == "node"  # the node was read again (a plain attribute): still found
