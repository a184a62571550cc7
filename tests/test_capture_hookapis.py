"""Hooks PyTorch APIs keep outside any hook dict (capture/hookapis.py): end-of-backward callbacks
(`queue_callback`), `register_multi_grad_hook` (modes "all" and "any") and leaf_function's
multi-grad hook. Each hook records its own name as it runs; hooktrace's order must equal that
record, and the run must be the same traced and untraced (outputs, grads, hook dicts, the engine)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import pytest
import torch
from torch.autograd import Variable

import hooktrace


def _named(log: list[str], name: str, then: Callable[[], None] = lambda: None) -> Callable[..., None]:
    def hook(*args: Any) -> None:
        log.append(name)
        then()

    hook.__name__ = hook.__qualname__ = name
    return hook


def _run(traced: bool, steps: int = 2) -> dict[str, Any]:
    torch.manual_seed(0)
    log: list[str] = []
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    end = _named(log, "at_end")
    # a grad hook that queues an end-of-backward callback, as DDP and FSDP do
    m[2].weight.register_hook(_named(log, "queues", lambda: Variable._execution_engine.queue_callback(end)))
    m[0].weight.register_post_accumulate_grad_hook(_named(log, "acc_w0"))
    x = torch.randn(5, 4, requires_grad=True)
    dicts_before = [dict(p._backward_hooks or {}) for p in m.parameters()]
    engine = Variable._execution_engine
    outs = []
    with hooktrace.trace(m) if traced else contextlib.nullcontext() as t:
        for _ in range(steps):
            out = m(x)
            every = torch.autograd.graph.register_multi_grad_hook(
                (m[0].weight, m[2].bias), _named(log, "all_of")
            )
            first = torch.autograd.graph.register_multi_grad_hook(
                (m[0].bias, m[2].weight), _named(log, "any_of"), mode="any"
            )
            out.sum().backward()
            every.remove()
            first.remove()
            outs.append(out.detach())
    return {
        "log": log,
        "tensors": [*outs, x.grad, *(p.grad for p in m.parameters())],
        "dicts": [dict(p._backward_hooks or {}) for p in m.parameters()] == dicts_before,
        "engine": Variable._execution_engine is engine,
        "trace": t.trace if traced else None,
    }


def test_callbacks_and_multi_grad_hooks_run_in_the_order_hooktrace_records() -> None:
    plain, traced = _run(False), _run(True)
    assert traced["log"] == plain["log"]
    assert plain["log"].count("at_end") == 2 and plain["log"].count("any_of") == 2
    for a, b in zip(plain["tensors"], traced["tensors"]):
        assert torch.equal(a, b)
    assert traced["dicts"] and plain["dicts"]
    assert traced["engine"] and type(Variable._execution_engine) is torch._C._ImperativeEngine
    trace = traced["trace"]
    names = {h.id: h.name for h in trace.hooks}
    assert [names[e.hook] for e in trace.events if e.type == "hook"] == plain["log"]
    kinds = {h.name: h.kind for h in trace.hooks}
    assert kinds["at_end"] == "final_callback" and kinds["all_of"] == kinds["any_of"] == "multi_grad"
    # one callback queued in every backward by one line is one hook; each registration of a
    # multi-grad hook is its own, registered on this file's line, never PyTorch's inner hooks
    assert [h.name for h in trace.hooks].count("at_end") == 1
    assert [h.name for h in trace.hooks].count("all_of") == 2
    assert not [h for h in trace.hooks if "inner_hook" in h.name or "wrapped_fn" in h.name]
    for h in trace.hooks:
        if h.kind in ("final_callback", "multi_grad"):
            assert h.registered_at.startswith("tests/test_capture_hookapis.py"), h
    assert {e.phase for e in trace.events if e.kind in ("final_callback", "multi_grad")} == {"backward"}


def test_a_callback_queued_after_the_block_is_not_traced() -> None:
    log: list[str] = []
    x = torch.randn(2, requires_grad=True)
    with hooktrace.trace():
        pass
    x.register_hook(_named(log, "q", lambda: Variable._execution_engine.queue_callback(_named(log, "end"))))
    (x * 2).sum().backward()
    assert log == ["q", "end"]


def test_a_multi_grad_hook_registered_before_the_block_is_traced_and_given_back() -> None:
    log: list[str] = []
    lin = torch.nn.Linear(2, 1)
    user = _named(log, "before")
    torch.autograd.graph.register_multi_grad_hook((lin.weight, lin.bias), user)
    inner = next(iter(lin.weight._backward_hooks.values()))
    with hooktrace.trace(lin) as t:
        lin(torch.randn(3, 2)).sum().backward()
    assert log == ["before"]
    (hook,) = [h for h in t.trace.hooks if h.kind == "multi_grad"]
    assert hook.name == "before"
    assert [e.hook for e in t.trace.events if e.type == "hook"] == [hook.id]
    # the closure holds the user's function again, and the dict PyTorch's inner hook
    assert next(iter(lin.weight._backward_hooks.values())) is inner
    cell = inner.__closure__[inner.__code__.co_freevars.index("fn")]
    assert cell.cell_contents is user


def _leaf_run(traced: bool) -> tuple[list[str], Any, Any]:
    leaf_function = pytest.importorskip("torch._dynamo.decorators").__dict__.get("leaf_function")
    if leaf_function is None or not hasattr(leaf_function(lambda x: x), "register_multi_grad_hook"):
        pytest.skip("leaf_function(...).register_multi_grad_hook is new in torch 2.13")
    log: list[str] = []

    @leaf_function
    def scaled(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (x * 2,)

    @scaled.register_fake
    def _(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.empty_like(x),)

    @scaled.register_multi_grad_hook
    def leaf_grads(grad: torch.Tensor) -> None:
        log.append("leaf_grads")

    x = torch.randn(3, requires_grad=True)
    with hooktrace.trace() if traced else contextlib.nullcontext() as t:
        x.register_hook(_named(log, "x_grad"))
        for _ in range(2):
            scaled(x)[0].sum().backward()
    return log, x.grad, t.trace if traced else None


def test_leaf_function_multi_grad_hook_is_its_own_kind_named_by_the_users_hook() -> None:
    plain_log, plain_grad, _ = _leaf_run(False)
    log, grad, trace = _leaf_run(True)
    assert log == plain_log and torch.equal(grad, plain_grad)
    names = {h.id: h.name for h in trace.hooks}
    assert [names[e.hook].rsplit(".", 1)[-1] for e in trace.events if e.type == "hook"] == plain_log
    leaf = [h for h in trace.hooks if h.kind == "leaf_multi_grad"]
    assert leaf and all(h.name.endswith("leaf_grads") for h in leaf)
    assert not [h for h in trace.hooks if h.kind == "multi_grad"]
