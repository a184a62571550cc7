"""Hooks the model holds when a session opens, taken dict by dict or many dicts at once
(capture/batched.py, issue 34): the same trace either way, and the order the hooks record themselves."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.capture.records import HookBook

LOG: list[str] = []  # the hooks' own record (plain functions: no closure, as most tensor hooks)


def grad(g: torch.Tensor) -> None:
    LOG.append("grad")


def first(g: torch.Tensor) -> None:
    LOG.append("first")


def accumulated(p: torch.Tensor) -> None:
    LOG.append("accumulated")


def _model(log: list[str]) -> tuple[nn.Module, torch.Tensor]:
    log.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.Linear(4, 2))
    for layer in (model[0], model[2], model[3]):
        layer.weight.register_hook(grad)
    model[2].bias.register_hook(grad)
    handle = model[2].bias.register_hook(first)
    model[2].bias._backward_hooks.move_to_end(
        handle.id, last=False
    )  # before a smaller id: inferred prepended
    model[3].bias.register_post_accumulate_grad_hook(accumulated)
    return model, torch.randn(3, 4)


def _facts(session: Any) -> tuple[list, list]:
    trace = session.trace
    hooks = [
        (h.id, h.kind, h.scope, h.module, h.tensor, h.name, h.defined_at, h.prepend) for h in trace.hooks
    ]
    events = [(e.type, e.hook, e.module, e.kind, e.phase) for e in trace.events]
    return hooks, events


@pytest.mark.parametrize("together", [True, False])
def test_tensor_hooks_held_before_the_block_are_traced_in_the_order_they_run(
    together: bool, monkeypatch: Any
) -> None:
    if not together:
        monkeypatch.setattr(HookBook, "wrap_tensor_dicts", lambda self, run: False)
        monkeypatch.setattr(HookBook, "unwrap_all", lambda self, ds: None)
    log = LOG
    model, x = _model(log)
    held = [
        (d, [*d.items()])
        for p in model.parameters()
        for d in (p._backward_hooks, p._post_accumulate_grad_hooks)
        if d
    ]
    with hooktrace.trace(model) as session:
        model(x).sum().backward()
    assert all(
        [*d.items()] == items and all(a[1] is b[1] for a, b in zip(d.items(), items)) for d, items in held
    )
    hooks, events = _facts(session)
    by_id = {h[0]: h for h in hooks}
    fired = [by_id[hid][5] for kind, hid, *_ in events if kind == "hook"]
    assert fired == log and len(log) == 6  # the hooks' own record
    tensors = {h[4] for h in hooks}
    assert tensors == {"0.weight", "2.weight", "2.bias", "3.weight", "3.bias"}
    assert [h[7] for h in hooks if h[5].endswith("first")] == [True]
    for dict_ in (model[0].weight._backward_hooks, model[2].bias._backward_hooks):
        assert all(
            type(fn).__name__ == "function" and fn.__name__ != "hooktrace_shim" for fn in dict_.values()
        )


def test_taken_together_or_one_by_one_the_trace_is_the_same(monkeypatch: Any) -> None:
    facts = []
    for together in (True, False):
        if not together:
            monkeypatch.setattr(HookBook, "wrap_tensor_dicts", lambda self, run: False)
            monkeypatch.setattr(HookBook, "unwrap_all", lambda self, ds: None)
        model, x = _model(LOG)
        with hooktrace.trace(model) as session:
            model(x).sum().backward()
        hooks, events = _facts(session)
        first = min(h[0] for h in hooks)  # handle ids differ between the two models
        facts.append(
            (
                [(h[0] - first, *h[1:]) for h in hooks],
                [(*e[:1], e[1] - first if e[1] else None, *e[2:]) for e in events],
            )
        )
    assert facts[0] == facts[1]


@pytest.mark.parametrize("together", [True, False])
def test_hooks_held_on_parameters_a_move_replaced_are_said_never_fired_by_their_name(
    together: bool, monkeypatch: Any
) -> None:
    """Tensor hooks on two parameters before the block, the model moved to meta inside it: each hook
    stays on its old tensor and never fires, named after the parameter the move replaced."""
    if not together:
        monkeypatch.setattr(HookBook, "wrap_tensor_dicts", lambda self, run: False)
    model, x = _model(LOG)
    with hooktrace.trace(model) as session:
        model.to("meta")
        model(x.to("meta")).sum().backward()
    assert LOG == []
    [never] = [s for s in session.trace.surprises if s.rule == "never-fired"]
    for name in ("0.weight", "2.weight", "2.bias", "3.weight", "3.bias"):
        assert name in never.message
    assert "replaced the parameter by a new tensor" in never.message


class _OwnWalk(nn.Linear):
    def named_modules(self, *args: Any, **kwargs: Any) -> Any:  # a class that walks its modules its own way
        return super().named_modules(*args, **kwargs)


def _structures() -> list[nn.Module]:
    shared = nn.Linear(2, 2)
    flat = nn.Sequential(*[nn.Linear(2, 2) for _ in range(5)])
    twice = nn.Sequential(shared, nn.ReLU(), shared)  # the same leaf twice among siblings
    earlier = nn.Sequential(
        nn.Sequential(shared), nn.Sequential(nn.ReLU(), shared)
    )  # met in an earlier subtree
    holes = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    holes.register_module("gap", None)  # a None child is skipped
    own = nn.Sequential(nn.Linear(2, 2), _OwnWalk(2, 2))
    mixed = nn.ModuleDict({"a": nn.Sequential(nn.ReLU(), nn.Tanh()), "b": nn.Linear(2, 2), "c": flat})
    return [
        flat,
        twice,
        earlier,
        holes,
        own,
        mixed,
        nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2), 2, enable_nested_tensor=False),
    ]


@pytest.mark.parametrize("model", _structures())
def test_the_model_walk_gives_named_modules_pairs(model: nn.Module) -> None:
    """roots.module_list, which takes a module's leaf children together, against PyTorch's own walk."""
    from hooktrace.capture.roots import module_list

    ours, torchs = module_list(model), list(model.named_modules())
    assert [p for p, _ in ours] == [p for p, _ in torchs]
    assert all(a is b for (_, a), (_, b) in zip(ours, torchs))
