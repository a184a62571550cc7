"""The module-call wrapper's place (capture/modulecall.py): PyTorch's own `nn.Module.__call__` runs it.

While a block is open, `nn.Module.__call__` stays PyTorch's function object (its code is the
wrapper's), so no subclass's `__call__` slot is updated at either end of the block; where
`nn.Module.__call__` is someone else's, the wrapper is set in its place as before. Each test asks
what a user's code could see: the object, the module's globals, the calls recorded, a call that
outlives its block.
"""

from __future__ import annotations

import threading
import types
from typing import Any

import torch
import torch.nn.modules.module as nn_module
from torch import nn

import hooktrace
from hooktrace.capture import modulecall

PYTORCHS = nn_module.Module._wrapped_call_impl
PYTORCHS_CODE = PYTORCHS.__code__


def _order(trace: Any) -> list[str]:
    return [f"{e.type} {e.module}" for e in trace.events if e.type in ("enter", "exit")]


def test_module_call_stays_pytorchs_function_inside_the_block() -> None:
    """What a hook finds as `nn.Module.__call__` is PyTorch's function, traced as untraced; the
    outputs are equal, the hooks' own record is the trace's order, and PyTorch's code and module
    globals are as they were after the block."""

    def run(traced: bool) -> tuple[list[str], list[Any], torch.Tensor, Any]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        log: list[str] = []
        seen: list[Any] = []

        def pre(m: nn.Module, a: Any) -> None:
            log.append("pre")

        def fwd(m: nn.Module, a: Any, o: Any) -> None:
            log.append("fwd")
            seen.append(vars(nn.Module)["__call__"])

        model[0].register_forward_pre_hook(pre)
        model[0].register_forward_hook(fwd)
        x = torch.randn(1, 2)
        if not traced:
            return log, seen, model(x), None
        with hooktrace.trace(model) as t:
            out = model(x)
            seen.append(vars(nn.Module)["__call__"])
        return log, seen, out, t.trace

    plain_log, plain_seen, plain_out, _ = run(False)
    log, seen, out, trace = run(True)
    assert plain_seen == [PYTORCHS] and seen == [PYTORCHS, PYTORCHS]
    assert log == plain_log == ["pre", "fwd"] and torch.equal(out, plain_out)
    assert [trace.hook(e.hook).name.rsplit(".", 1)[-1] for e in trace.hook_events()] == log  # qualnames
    assert PYTORCHS.__code__ is PYTORCHS_CODE and modulecall.STATE_NAME not in vars(nn_module)
    assert _order(trace) == ["enter ", "enter 0", "exit 0", "enter 1", "exit 1", "exit "]


def test_another_wrapper_on_module_call_is_replaced_for_the_block_and_put_back() -> None:
    """A library's own `nn.Module.__call__` (here one that calls `_call_impl` itself, not PyTorch's
    function): the capture's wrapper stands in its place while the block is open, as PyTorch's
    would be recorded, and the library's is there again after."""
    calls: list[str] = []

    def theirs(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        calls.append(type(self).__name__)
        return self._call_impl(*args, **kwargs)

    model = nn.Sequential(nn.Linear(2, 2))
    nn.Module.__call__ = theirs  # type: ignore[method-assign]
    try:
        with hooktrace.trace(model) as t:
            model(torch.randn(1, 2))
            inside = vars(nn.Module)["__call__"]
        after = vars(nn.Module)["__call__"]
        model(torch.randn(1, 2))
    finally:
        nn.Module.__call__ = PYTORCHS  # type: ignore[method-assign]
    assert inside is not theirs and after is theirs
    assert PYTORCHS.__code__ is PYTORCHS_CODE
    assert calls == ["Sequential", "Linear"]  # after the block only: inside, the capture's wrapper ran
    assert _order(t.trace) == ["enter ", "enter 0", "exit 0", "exit "]


def test_a_call_that_began_inside_the_block_ends_after_it_on_another_thread() -> None:
    """The state a call reads is taken as it begins: a call still running on another thread when
    the block ends returns its result, raises nothing, and later calls record nothing."""
    entered, release = threading.Event(), threading.Event()

    class Waits(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            entered.set()
            assert release.wait(10)
            return x * 2

    model = Waits()
    results: list[Any] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            results.append(model(torch.ones(2)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with hooktrace.trace(model) as t:
        thread = threading.Thread(target=call)
        thread.start()
        assert entered.wait(10)
    release.set()
    thread.join(10)
    assert not errors and len(results) == 1 and torch.equal(results[0], torch.full((2,), 2.0))
    n = len(t.trace.events)
    model(torch.ones(2))  # released: returns at once
    assert len(t.trace.events) == n


def test_the_wrapper_code_run_when_the_block_has_just_ended_is_pytorchs_call() -> None:
    """A call that began as the block ended (its state is gone from PyTorch's globals) runs as
    PyTorch's `_wrapped_call_impl` would: same result, nothing recorded."""
    assert modulecall.STATE_NAME not in vars(nn_module)
    late = types.FunctionType(modulecall.SWAPPED_CODE, vars(nn_module), "_wrapped_call_impl")
    model = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    assert torch.equal(late(model, x), model(x))


def test_pytorchs_function_is_recognised() -> None:
    """The swap is used for this torch's `_wrapped_call_impl` (so the slot is never set), and not for
    a function with another body."""

    def other(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self._call_impl(*args, **kwargs)

    assert modulecall.swappable(PYTORCHS)
    assert not modulecall.swappable(other)
    assert not modulecall.swappable(types.FunctionType(PYTORCHS_CODE, {"torch": torch}, "_wrapped_call_impl"))
