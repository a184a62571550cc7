"""Global hook dicts rebound inside the block: the new dicts' hooks fire and are traced, the old ones not.

PyTorch's own tests' tearDown and libraries that reset the global hooks assign fresh dicts to
`torch.nn.modules.module._global_*` (and `torch.optim.optimizer._global_optimizer_*`). Traced code
must read them live, as PyTorch's does. Each case runs untraced and traced; the hooks' own record
is the oracle.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Optional

import pytest
import torch
import torch.nn.modules.module as nn_module
import torch.optim.optimizer as optim_module
from torch import nn

import hooktrace

from .training_hooks import Log

MODULE_GLOBALS = [
    n for n in vars(nn_module) if n.startswith("_global_") and isinstance(vars(nn_module)[n], dict)
]
OPTIMIZER_GLOBALS = ["_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"]


def _rebind(namespace: Any, names: list[str]) -> dict[str, Any]:
    saved = {n: getattr(namespace, n) for n in names}
    for n in names:
        setattr(namespace, n, OrderedDict())
    return saved


def _restore(namespace: Any, saved: dict[str, Any]) -> None:
    for n, d in saved.items():
        setattr(namespace, n, d)


def _module_run(traced: bool) -> tuple[list[str], Optional[Any], list[torch.Tensor]]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    L = Log()
    stale = [nn_module.register_module_forward_hook(L.fn("stale_fwd"))]  # in the dicts rebound below
    stale.append(nn_module.register_module_forward_pre_hook(L.fn("stale_pre")))
    t = hooktrace.trace(m) if traced else None
    ctx = t.__enter__() if t is not None else None
    saved = _rebind(nn_module, MODULE_GLOBALS)
    try:
        nn_module.register_module_forward_pre_hook(L.fn("pre"))
        nn_module.register_module_forward_hook(L.fn("fwd"))
        nn_module.register_module_forward_hook(L.fn("always"), always_call=True)
        nn_module.register_module_forward_hook(lambda mod, a, k, o: L.log.append("kw"), with_kwargs=True)
        nn_module.register_module_full_backward_pre_hook(L.fn("bpre"))
        nn_module.register_module_full_backward_hook(L.fn("bwd"))
        nn_module.register_module_module_registration_hook(L.fn("modreg"))
        nn_module.register_module_parameter_registration_hook(L.fn("parreg"))
        nn_module.register_module_buffer_registration_hook(L.fn("bufreg"))
        x = torch.randn(2, 3, requires_grad=True)
        out = m(x)
        out.sum().backward()
        m.add_module("extra", nn.Identity())
        m.register_parameter("p", nn.Parameter(torch.ones(1)))
        m.register_buffer("b", torch.zeros(1))
    finally:
        _restore(nn_module, saved)
        if t is not None:
            t.__exit__(None, None, None)
        for h in stale:
            h.remove()
    return L.log, ctx, [out.detach(), x.grad]


def test_module_global_dicts_rebound_inside_the_block_are_read_live():
    log, _, plain = _module_run(False)
    assert "stale_fwd" not in log and "bwd" in log and "parreg" in log  # the oracle itself
    traced_log, ctx, got = _module_run(True)
    assert traced_log == log
    assert all(torch.equal(a, b) for a, b in zip(got, plain))
    labels = [e for e in log if e != "kw"]  # the with_kwargs lambda is named "<lambda>"
    assert Log.traced(Log(), ctx.trace) == labels


def _optimizer_run(traced: bool) -> tuple[list[str], Optional[Any]]:
    torch.manual_seed(0)
    m = nn.Linear(3, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    L = Log()
    stale = optim_module.register_optimizer_step_pre_hook(L.fn("stale"))
    t = hooktrace.trace(m) if traced else None
    ctx = t.__enter__() if t is not None else None
    saved = _rebind(optim_module, OPTIMIZER_GLOBALS)
    try:
        optim_module.register_optimizer_step_pre_hook(L.fn("gpre"))
        optim_module.register_optimizer_step_post_hook(L.fn("gpost"))
        m(torch.ones(3)).sum().backward()
        opt.step()
    finally:
        _restore(optim_module, saved)
        if t is not None:
            t.__exit__(None, None, None)
        stale.remove()
    return L.log, ctx


def test_optimizer_global_dicts_rebound_inside_the_block_are_read_live():
    log, _ = _optimizer_run(False)
    assert log == ["gpre", "gpost"]
    traced_log, ctx = _optimizer_run(True)
    assert traced_log == log and Log().traced(ctx.trace) == log


@pytest.mark.parametrize("when", ["before", "inside"])
def test_rebound_before_the_block_then_restored_inside(when):
    """The nearest case: the dicts PyTorch holds at each call are the ones read, whenever rebound."""
    m = nn.Linear(2, 2)
    L = Log()
    saved = _rebind(nn_module, ["_global_forward_hooks"]) if when == "before" else {}
    first = nn_module.register_module_forward_hook(L.fn("first"))
    with hooktrace.trace(m) as t:
        m(torch.ones(2))
        if when == "inside":
            saved = _rebind(nn_module, ["_global_forward_hooks"])
            nn_module.register_module_forward_hook(L.fn("second"))
            m(torch.ones(2))
        _restore(nn_module, saved)
        m(torch.ones(2))
    first.remove()
    if when == "inside":
        assert L.log == ["first", "second", "first"]
    else:
        assert L.log == ["first"]  # the first dict was dropped by the restore
    assert L.traced(t.trace) == L.log
