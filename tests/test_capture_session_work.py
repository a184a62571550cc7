"""What a session reads at its start and end is what it read before it was made cheaper (issue 34).

The per-process work (hooktrace's own code objects marked for Dynamo) is done once: a later
session walks no module of hooktrace again, but a module imported since is still marked. The
walk over the model gives `named_modules()`'s pairs, and the hook dicts read are the non-empty
ones, in PyTorch's firing order. No timings here: benchmarks/ measures them.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Iterator

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.capture import dicts, dynamo, roots

from .training_hooks import no_gc


def _hook(*args: Any) -> None:
    return None


class _Shared(nn.Module):
    """The same child under two names, a None child, a nested block."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = self.a
        self.none = None
        self.block = nn.Sequential(nn.ReLU(), nn.Sequential(nn.Linear(2, 2), self.a))


class _OwnWalk(nn.Module):
    """A class with its own `named_modules`: the model is walked by it."""

    def __init__(self) -> None:
        super().__init__()
        self.x = nn.Linear(2, 2)
        self.hidden = nn.Linear(2, 2)

    def named_modules(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, nn.Module]]:
        for name, module in super().named_modules(*args, **kwargs):
            if not name.endswith("hidden"):
                yield name, module


@pytest.mark.parametrize(
    "make",
    [
        lambda: _Shared(),
        lambda: nn.Sequential(nn.Linear(2, 2), nn.Sequential(_OwnWalk(), nn.ReLU())),
        lambda: _OwnWalk(),
        lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2), 2, enable_nested_tensor=False),
        lambda: nn.Linear(2, 2),
    ],
)
def test_module_list_is_named_modules(make: Any) -> None:
    model = make()
    assert roots.module_list(model) == list(model.named_modules())
    assert roots.model_modules(model) == list(model.named_modules())


def _old_hook_dicts(model: nn.Module) -> list[tuple[int, str, Any, str, Any]]:
    """The reading before issue 34: every dict, empty or not, filtered afterwards."""
    found = []
    for attr, _ in dicts.GLOBAL_DICTS + dicts.GLOBAL_OPTIMIZER_DICTS:
        d = dicts.global_dict(attr)
        if d is not None:
            found.append((d, dicts.kind_of(attr, None), None, "global", None))
    params: dict[int, Any] = {}
    for module in model.modules():
        for attr, _ in dicts.MODULE_DICTS:
            d = module.__dict__.get(attr)
            if d is not None:
                found.append((d, dicts.kind_of(attr, module), module, "module", None))
        for param in module.__dict__.get("_parameters", {}).values():
            if param is not None:
                params.setdefault(id(param), param)
    for param in params.values():
        for attr, kind in dicts.TENSOR_DICTS:
            d = getattr(param, attr, None)
            if d is not None:
                found.append((d, kind, None, "tensor", param))
    return [(id(d), kind, owner, scope, tensor) for d, kind, owner, scope, tensor in found if d]


def test_hook_dicts_are_the_non_empty_ones_in_firing_order() -> None:
    model = _Shared()
    handles = [
        model.block[1][0].register_forward_hook(_hook),
        model.a.register_forward_pre_hook(_hook),
        model.a.register_full_backward_hook(_hook),
        model.register_state_dict_pre_hook(_hook),
        model.a.weight.register_hook(_hook),
        model.block[1][0].bias.register_post_accumulate_grad_hook(_hook),
        nn.modules.module.register_module_forward_hook(_hook),
    ]
    try:
        got = [(id(hd.d), hd.kind, hd.owner, hd.scope, hd.tensor) for hd in dicts.hook_dicts(model)]
        assert got == _old_hook_dicts(model)
        assert len(got) == 7
        assert all(hd.d for hd in dicts.hook_dicts(nn.Sequential(nn.Linear(2, 2))))
    finally:
        for h in handles:
            h.remove()


def test_a_module_without_every_hook_dict_is_read() -> None:
    """A module whose __init__ was not run to the end lacks some dicts: the others are still read."""
    model = nn.Linear(2, 2)
    handle = model.register_forward_hook(_hook)
    del model.__dict__["_state_dict_hooks"]
    try:
        assert [hd.kind for hd in dicts.hook_dicts_in([model])] == ["forward"]
    finally:
        handle.remove()


def test_own_code_is_walked_once_per_process_and_new_modules_still(monkeypatch: pytest.MonkeyPatch) -> None:
    if dynamo.set_code_exec_strategy is None:
        pytest.skip("no Dynamo frame strategies in this torch")
    marked: list[types.CodeType] = []
    real = dynamo.set_code_exec_strategy
    monkeypatch.setattr(
        dynamo, "set_code_exec_strategy", lambda code, s: (marked.append(code), real(code, s))
    )
    model = nn.Linear(2, 2)
    with hooktrace.trace(model):
        model(torch.randn(1, 2))
    walked: list[str] = []
    original = dynamo._module_codes

    def counting(name: str, module: Any) -> Iterator[types.CodeType]:
        walked.append(name)
        return original(name, module)

    monkeypatch.setattr(dynamo, "_module_codes", counting)
    marked.clear()
    with hooktrace.trace(model):
        model(torch.randn(1, 2))
    assert walked == [] and marked == []  # nothing of hooktrace walked or marked again

    def later() -> None:
        return None

    fresh = types.ModuleType("hooktrace._issue34_later")
    fresh.later = later  # type: ignore[attr-defined]
    later.__code__ = compile(
        "def later():\n    return None\n", f"{dynamo._HERE}/_issue34_later.py", "exec"
    ).co_consts[0]
    monkeypatch.setitem(sys.modules, "hooktrace._issue34_later", fresh)
    with hooktrace.trace(model):
        model(torch.randn(1, 2))
    assert walked == ["hooktrace._issue34_later"]
    assert marked == [later.__code__]


def test_a_session_and_its_trace_are_freed_when_let_go() -> None:
    """No cycle holds a finished session: its trace (every event and hook) goes when the caller lets
    go of it, by reference counting, as untraced code frees what it made, not at a later GC pass."""
    import weakref

    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    model[0].register_forward_hook(_hook)
    model[0].weight.register_hook(_hook)
    with no_gc():
        with hooktrace.trace(model) as session:
            model(torch.randn(3, 2)).sum().backward()
        trace = session.trace
        assert len(trace.events) > 0
        alive = [weakref.ref(session), weakref.ref(trace), weakref.ref(trace.hooks[0])]
        del session, trace
        assert [ref() is None for ref in alive] == [True, True, True]


def test_a_wrapper_kept_past_its_capture_holds_no_session() -> None:
    """A class that kept `nn.Module.__call__` while the block was open (its own `__call__ = ...`)
    still calls modules as PyTorch does afterwards, and keeps nothing of the capture alive."""
    import weakref

    with no_gc():
        with hooktrace.trace() as session:
            kept = nn.Module.__call__
        ref = weakref.ref(session)
        del session
        assert ref() is None
    model = nn.Linear(2, 2)
    x = torch.randn(1, 2)
    assert torch.equal(kept(model, x), model(x))
