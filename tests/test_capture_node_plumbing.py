"""PyTorch's own node hooks are never listed as user hooks.

A module with full backward hooks puts `BackwardHook`'s hook on the `grad_fn` of its output (a
legacy backward hook puts a `_WrappedHook` there). A user hook registered on that same node must be
traced, PyTorch's must not appear; a user hook registered there before the block still is traced.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace

from .training_hooks import Log

# PyTorch's own deprecation notice for a legacy backward hook on a Linear (several autograd nodes)
pytestmark = pytest.mark.filterwarnings("ignore:Using a non-full backward hook:FutureWarning")


def _run(traced: bool, legacy: bool, prehook: bool, before: bool) -> tuple[Log, Any, list[torch.Tensor]]:
    """`before`: the module ran and a user hook went on its output's node before the block."""
    torch.manual_seed(0)
    m = nn.Linear(2, 2)
    L = Log()
    if legacy:
        m.register_backward_hook(L.fn("module_bwd"))
    else:
        m.register_full_backward_hook(L.fn("module_bwd"))
    x = torch.ones(1, 2, requires_grad=True)
    if before:
        out = m(x)
        out.grad_fn.register_hook(L.fn("before_block"))
    with hooktrace.trace(m) if traced else nullcontext() as t:
        if not before:
            out = m(x)
        register = out.grad_fn.register_prehook if prehook else out.grad_fn.register_hook
        register(L.fn("user_node"))
        out.sum().backward()
    return L, t, [x.grad, m.weight.grad]


@pytest.mark.parametrize("legacy", [False, True], ids=["full", "legacy"])
@pytest.mark.parametrize("prehook", [False, True], ids=["hook", "prehook"])
def test_user_node_hook_beside_pytorchs_backward_hook(legacy, prehook):
    plain, _, grads = _run(False, legacy, prehook, before=False)
    L, t, traced_grads = _run(True, legacy, prehook, before=False)
    assert L.log == plain.log and sorted(L.log) == ["module_bwd", "user_node"]
    assert all(torch.equal(a, b) for a, b in zip(grads, traced_grads))
    assert L.traced(t.trace) == L.log  # every user hook, in PyTorch's order
    assert sorted(h.name for h in t.trace.hooks) == ["hook_module_bwd", "hook_user_node"]


@pytest.mark.parametrize("legacy", [False, True], ids=["full", "legacy"])
def test_user_node_hook_registered_before_the_block_on_that_node_is_still_traced(legacy):
    plain, _, grads = _run(False, legacy, False, before=True)
    L, t, traced_grads = _run(True, legacy, False, before=True)
    assert L.log == plain.log and "before_block" in L.log
    assert all(torch.equal(a, b) for a, b in zip(grads, traced_grads))
    # the module's backward hook was bound by PyTorch in the forward before the block: not traced
    assert L.traced(t.trace) == [label for label in L.log if label != "module_bwd"]
    names = sorted(h.name for h in t.trace.hooks)
    assert names == ["hook_before_block", "hook_module_bwd", "hook_user_node"]
