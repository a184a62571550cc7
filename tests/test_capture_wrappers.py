"""Forward wrappers (accelerate-style), DDP communication hooks, and the training-step samples.

Every hook logs its own label as it runs; hooktrace's order must equal that log.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.capture.records import SYNTHETIC_BASE

from .training_hooks import (
    Log,
    add_hook_to_module,
    model,
)

# -- forward wrappers ----------------------------------------------------------------------------


def test_forward_wrapper_runs_between_pre_hooks_and_forward_hooks():
    m = model()
    L = Log()
    with hooktrace.trace(m) as t:
        m[0].register_forward_pre_hook(L.fn("pre"))
        m[0].register_forward_hook(L.fn("fwd"))
        add_hook_to_module(m[0], L.log)
        wrapped = m[0].forward
        m(torch.randn(2, 4))
        m(torch.randn(2, 4))
        assert m[0].forward is wrapped
    trace = t.trace
    assert L.log == ["pre", "wrapper:Linear", "fwd"] * 2
    [wrapper] = [h for h in trace.hooks if h.kind == "forward_wrapper"]
    assert (wrapper.scope, wrapper.module, wrapper.name) == (
        "module",
        "0",
        "partial(add_hook_to_module.<locals>.new_forward) → Linear.forward",
    )
    assert wrapper.defined_at.startswith("tests/training_hooks.py:")  # the wrapper's code, not torch's
    assert wrapper.id >= SYNTHETIC_BASE
    order = [
        trace.hook(e.hook).name for e in trace.hook_events() if e.module == "0"
    ]  # pre-hook, wrapper, forward hook
    assert order == ["hook_pre", wrapper.name, "hook_fwd"] * 2
    assert all(e.phase == "forward" for e in trace.hook_events())
    assert "forward" in m[0].__dict__ and m[0].forward is wrapped


@pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")  # torch's own deprecation notice
@pytest.mark.filterwarnings("ignore:`torch.jit.trace:FutureWarning")  # the same notice from torch 2.14 on
def test_forward_wrapper_traced_vs_untraced_and_jit_trace():
    def run(traced: bool) -> tuple:
        m = model()
        log: list[str] = []
        add_hook_to_module(m[2], log)
        x = torch.randn(2, 4, requires_grad=True)
        if traced:
            with hooktrace.trace(m):
                y = m(x)
                y.sum().backward()
                scripted = torch.jit.trace(m, x)
        else:
            y = m(x)
            y.sum().backward()
            scripted = torch.jit.trace(m, x)
        return y, x.grad, log, scripted(x)

    a, b = run(False), run(True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2] and torch.equal(a[3], b[3])


def test_accelerate_add_hook_to_module_if_installed():
    hooks = pytest.importorskip("accelerate.hooks")
    m = model()
    L = Log()

    class Hook(hooks.ModelHook):
        def pre_forward(self, module, *args, **kwargs):
            L.log.append("accelerate_pre")
            return args, kwargs

    with hooktrace.trace(m) as t:
        m[0].register_forward_pre_hook(L.fn("pre"))
        m[0].register_forward_hook(L.fn("fwd"))
        hooks.add_hook_to_module(m[0], Hook())
        m(torch.randn(2, 4))
    assert L.log == ["pre", "accelerate_pre", "fwd"]
    kinds = [e.kind for e in t.trace.hook_events() if e.module == "0"]
    assert kinds == ["forward_pre", "forward_wrapper", "forward"]


def _wraps_closure(module: nn.Module, log: list[str]) -> str:
    orig = module.forward

    @functools.wraps(orig)
    def my_wrapper(*args: Any, **kwargs: Any) -> Any:
        log.append("wrapper")
        return orig(*args, **kwargs)

    module.forward = my_wrapper
    return "_wraps_closure.<locals>.my_wrapper → Linear.forward"


def _plain_closure(module: nn.Module, log: list[str]) -> str:
    orig = module.forward

    def plain(*args: Any) -> Any:  # no functools.wraps: what it wraps is the one callable it holds
        log.append("wrapper")
        return orig(*args)

    module.forward = plain
    return "_plain_closure.<locals>.plain → Linear.forward"


def _logged_forward(module: nn.Module, log: list[str], *args: Any) -> Any:
    log.append("wrapper")
    return type(module).forward(module, *args)


def _partial(module: nn.Module, log: list[str]) -> str:
    module.forward = functools.partial(_logged_forward, module, log)
    return "partial(_logged_forward)"


class _CallableWrapper:
    def __init__(self, forward: Any, log: list[str]) -> None:
        functools.update_wrapper(self, forward)
        self.log = log

    def __call__(self, *args: Any) -> Any:
        self.log.append("wrapper")
        return self.__wrapped__(*args)


def _callable_object(module: nn.Module, log: list[str]) -> str:
    module.forward = _CallableWrapper(module.forward, log)
    return "_CallableWrapper → Linear.forward"


def _accelerate(module: nn.Module, log: list[str]) -> str:
    hooks = pytest.importorskip("accelerate.hooks")

    class Logged(hooks.ModelHook):
        def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            log.append("wrapper")
            return args, kwargs

    hooks.add_hook_to_module(module, Logged())
    return "partial(add_hook_to_module.<locals>.new_forward) → Linear.forward"


WRAPPER_STYLES = {
    "functools.wraps": (_wraps_closure, __file__),
    "closure": (_plain_closure, __file__),
    "partial": (_partial, __file__),
    "callable object": (_callable_object, __file__),
    "accelerate": (_accelerate, "accelerate/hooks.py"),
}


@pytest.mark.parametrize("style", list(WRAPPER_STYLES))
def test_forward_wrappers_are_named_by_their_own_code(style: str) -> None:
    """A forward wrapper is named and placed by its own code, then what it wraps; traced == untraced."""
    make, where = WRAPPER_STYLES[style]

    def run(traced: bool) -> tuple:
        m = model()
        L = Log()
        m[0].register_forward_pre_hook(L.fn("pre"))
        m[0].register_forward_hook(L.fn("fwd"))
        expected = make(m[0], L.log)
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
        if not traced:
            return m(x), L.log, None, expected
        with hooktrace.trace(m) as t:
            y = m(x)
        return y, L.log, t.trace, expected

    plain, (y, log, trace, expected) = run(False), run(True)
    assert torch.equal(plain[0], y) and plain[1] == log == ["pre", "wrapper", "fwd"]
    [wrapper] = [h for h in trace.hooks if h.kind == "forward_wrapper"]
    assert wrapper.name == expected
    assert "linear.py" not in wrapper.defined_at
    file = os.path.relpath(where) if os.path.isabs(where) else where
    assert wrapper.defined_at.rsplit(":", 1)[0] == file
    order = [trace.hook(e.hook).name for e in trace.hook_events() if e.module == "0"]
    assert order == ["hook_pre", expected, "hook_fwd"]  # the order the hooks recorded


# -- DDP communication hooks ---------------------------------------------------------------------


def test_ddp_comm_hook_order_against_backward_hooks(gloo_one_rank):
    L = Log()
    ddp = nn.parallel.DistributedDataParallel(model())

    def allreduce(state, bucket):  # DDP checks real annotations; these would be strings here
        L.log.append("comm")
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    with hooktrace.trace(ddp) as t:
        ddp.register_comm_hook(None, allreduce)
        assert ddp._comm_hooks[0][0] is allreduce
        inner = ddp.module
        inner[0].weight.register_post_accumulate_grad_hook(L.fn("acc0"))
        inner[2].register_full_backward_hook(L.fn("bwd2"))
        ddp(torch.randn(3, 4)).sum().backward()
    trace = t.trace
    names = {h.id: h.name for h in trace.hooks}
    traced = [
        "comm" if names[e.hook] == allreduce.__qualname__ else names[e.hook][len("hook_") :]
        for e in trace.hook_events()
        if names[e.hook] == allreduce.__qualname__ or names[e.hook].startswith("hook_")
    ]
    assert traced == L.log and "comm" in L.log
    [comm] = [h for h in trace.hooks if h.kind == "comm"]
    assert (comm.scope, comm.module, comm.id >= SYNTHETIC_BASE) == ("module", "", True)
    assert comm.registered_at.split(":")[0].endswith(os.path.basename(__file__))
    [event] = [e for e in trace.hook_events() if e.kind == "comm"]
    assert event.phase == "backward" and event.module == ""
    # after the block the reducer still calls the hook, without recording
    n = len(trace.events)
    L.log.clear()
    ddp(torch.randn(3, 4)).sum().backward()
    assert "comm" in L.log and len(t.trace.events) == n


def _future_of(bucket: Any) -> Any:
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _comm_function(L: Any) -> Any:
    def comm_fn(state, bucket):  # noqa: ANN001, ANN202 - DDP checks real annotations
        L.log.append("comm")
        return _future_of(bucket)

    return comm_fn


def _comm_partial(L: Any) -> Any:
    def comm_partial(log, state, bucket):  # noqa: ANN001, ANN202
        log.append("comm")
        return _future_of(bucket)

    return functools.update_wrapper(
        functools.partial(comm_partial, L.log), comm_partial
    )  # DDP reads __name__


class _CommObject:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.__name__ = self.__qualname__ = "comm_object"  # DDP reads them

    def __call__(self, state, bucket):  # noqa: ANN001, ANN204
        self.log.append("comm")
        return _future_of(bucket)

    def method(self, state, bucket):  # noqa: ANN001, ANN201
        self.log.append("comm")
        return _future_of(bucket)


COMM_STYLES = {
    "function": _comm_function,
    "partial": _comm_partial,
    "callable object": lambda L: _CommObject(L.log),
    "bound method": lambda L: _CommObject(L.log).method,
}


def _hooktrace_frames(run: Any) -> list[str]:
    """Files of every Python frame that runs during `run()` and is hooktrace's."""
    import sys

    here = os.path.dirname(hooktrace.__file__)
    seen: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        name = frame.f_code.co_filename
        if event == "call" and (name.startswith(here) or name.startswith("<hooktrace")):
            seen.append(f"{name}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("registered", ["before", "inside"])
@pytest.mark.parametrize("style", list(COMM_STYLES))
def test_ddp_comm_hook_before_or_inside_traced_and_the_users_own_after(gloo_one_rank, style, registered):
    L = Log()
    ddp = nn.parallel.DistributedDataParallel(model())
    hook = COMM_STYLES[style](L)
    code_before = (
        (getattr(hook, "func", None) or getattr(hook, "__func__", None) or hook).__code__
        if not isinstance(hook, _CommObject)
        else type(hook).__call__.__code__
    )
    if registered == "before":
        ddp.register_comm_hook(None, hook)
    ddp.module[2].register_full_backward_hook(L.fn("bwd2"))
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    with hooktrace.trace(ddp) as t:
        if registered == "inside":
            ddp.register_comm_hook(None, hook)
        ddp(x).sum().backward()
    trace = t.trace
    [comm] = [h for h in trace.hooks if h.kind == "comm"]
    assert comm.module == "" and (comm.registered_at is None) == (registered == "before")
    # named by the hook's own code, not by hooktrace's trampoline that stands for it in the block
    assert comm.defined_at == f"tests/test_capture_wrappers.py:{code_before.co_firstlineno}", comm.defined_at
    names = {h.id: h.name for h in trace.hooks}
    traced = ["comm" if e.hook == comm.id else names[e.hook][len("hook_") :] for e in trace.hook_events()]
    assert traced == L.log and L.log.count("comm") == 1  # the order the hooks recorded
    assert ddp._comm_hooks[0][0] is hook
    # after the block: the reducer's comm hook is the user's own; nothing of hooktrace runs
    after = (
        (getattr(hook, "func", None) or getattr(hook, "__func__", None) or hook).__code__
        if not isinstance(hook, _CommObject)
        else type(hook).__call__.__code__
    )
    assert after is code_before
    L.log.clear()
    frames = _hooktrace_frames(lambda: ddp(x).sum().backward())
    assert L.log == ["bwd2", "comm"] and frames == [], frames


def test_ddp_builtin_comm_hook_is_shown_as_not_traceable(gloo_one_rank):
    import torch.distributed as dist

    ddp = nn.parallel.DistributedDataParallel(model())
    ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    with hooktrace.trace(ddp) as t:
        ddp(torch.randn(3, 4)).sum().backward()
    [comm] = [h for h in t.trace.hooks if h.kind == "comm"]
    assert comm.name.endswith("(built-in)") and "ALLREDUCE" in comm.name
    [never] = [s for s in t.trace.surprises if s.rule == "never-fired"]
    assert never.level == "info" and "cannot see it" in never.message and never.hooks == [comm.id]


def test_ddp_without_comm_hook_shows_none(gloo_one_rank):
    ddp = nn.parallel.DistributedDataParallel(model())
    with hooktrace.trace(ddp) as t:
        ddp(torch.randn(3, 4)).sum().backward()
    assert not [h for h in t.trace.hooks if h.kind == "comm"]
    assert not [s for s in t.trace.surprises if s.rule == "never-fired"]


# -- the samples: traced order == what their hooks recorded ------------------------------------------


def _sample(name: str, tmp_path: Any) -> tuple[Any, list[str]]:
    from tests.test_samples import run_sample

    return run_sample(name, tmp_path)


def test_sample_training_step(tmp_path):
    trace, calls = _sample("training_step", tmp_path)
    names = {
        "make.<locals>.step_now": None,
        "make.<locals>.after_accumulate": "accumulated:body.weight",
        "make.<locals>.before_step": "optimizer_pre",
        "make.<locals>.after_step": "optimizer_post",
    }
    traced = []
    for e in trace.hook_events():
        hook = trace.hook(e.hook)
        label = names[hook.name]
        traced.append(label or f"in_backward_step:{hook.tensor}")
    assert traced == calls
    assert calls.index("accumulated:body.weight") < calls.index("optimizer_pre")
    kinds = {trace.hook(e.hook).name: (e.kind, e.phase) for e in trace.hook_events()}
    assert kinds["make.<locals>.after_accumulate"] == ("node", "backward")
    assert kinds["make.<locals>.before_step"] == ("optimizer_step_pre", "optimizer")
    [acc] = [h for h in trace.hooks if h.kind == "node"]
    assert (acc.module, acc.tensor) == ("body", "body.weight")


def test_sample_saved_tensors(tmp_path):
    trace, calls = _sample("saved_tensors", tmp_path)
    mine = [trace.hook(e.hook).name for e in trace.hook_events() if e.kind in ("pack", "unpack")]
    assert [n.split("_")[1] for n in mine if n.startswith("count_")] == calls
    first_recompute = next(e.seq for e in trace.events if e.phase == "recompute")
    trigger = trace.events[first_recompute - 1]
    assert trigger.kind == "unpack" and "_checkpoint_hook" in trace.hook(trigger.hook).name
    assert any("save_on_cpu" in trace.hook(e.hook).name for e in trace.hook_events() if e.module == "block.0")


def test_sample_forward_wrapper(tmp_path):
    trace, calls = _sample("forward_wrapper", tmp_path)
    assert calls == ["pre", "wrapper:pre_forward", "wrapper:post_forward", "post"]
    assert [e.kind for e in trace.hook_events() if e.module == "fc1"] == [
        "forward_pre",
        "forward_wrapper",
        "forward",
    ]


def test_class_forward_bound_on_the_instance_is_not_a_wrapper():
    m = model()
    with hooktrace.trace(m) as t:
        m[0].forward = m[0].forward  # what accelerate's remove_hook_from_module leaves
        m(torch.randn(2, 4))
    assert not [h for h in t.trace.hooks if h.kind == "forward_wrapper"]
