"""torch.compile forward: the hooks Dynamo compiles into a graph are named, in the order the hooks'
own record gives, and Dynamo compiles exactly what it compiles untraced.

Each hook appends its label as it runs (inside a graph Dynamo replays that append, in program
order). Traced and untraced runs are compared on Dynamo's counters (frames, graphs, graph breaks,
calls captured, recompiles), the outputs and the record; the trace's hook events, those inside a
compiled graph included, must be the record, in its order.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import pytest
import torch
from torch import nn

import hooktrace

dynamo = pytest.importorskip("torch._dynamo")
from torch._dynamo.utils import counters  # noqa: E402

# compiling imports a torch module that defines jit.script_method users, deprecated in torch 2.13
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


def _hook(log: list[str], label: str, result: Callable[..., Any] = lambda *a: None) -> Callable[..., Any]:
    def hook(*args: Any, **kwargs: Any) -> Any:
        log.append(label)
        return result(*args)

    hook.__name__ = hook.__qualname__ = label
    return hook


class _Labelled:
    """A callable object as a hook."""

    def __init__(self, log: list[str], label: str) -> None:
        self.log, self.label = log, label

    def __call__(self, module: nn.Module, args: Any, out: Any) -> None:
        self.log.append(self.label)


def _partial_pre(log: list[str], label: str, module: nn.Module, args: Any) -> None:
    log.append(label)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def _nested(log: list[str]) -> nn.Module:  # prepend, a callable object, a partial, nested modules
    m = _model()
    m.register_forward_pre_hook(_hook(log, "root_pre"))
    m[0].register_forward_pre_hook(_hook(log, "pre0"))
    m[0].register_forward_hook(_hook(log, "fwd0"))
    m[0].register_forward_hook(_hook(log, "fwd0_first"), prepend=True)
    m[2].register_forward_hook(_Labelled(log, "object2"))
    m[2].register_forward_pre_hook(functools.partial(_partial_pre, log, "partial2"))
    m.register_forward_hook(_hook(log, "root_fwd"))
    return m


def _changing(log: list[str]) -> nn.Module:  # hooks that change inputs and outputs, kwargs, always_call
    m = _model()
    m[0].register_forward_pre_hook(_hook(log, "scale_in", lambda mod, args: (args[0] * 2,)))
    m[2].register_forward_hook(_hook(log, "shift_out", lambda mod, args, out: out + 1))
    m[2].register_forward_hook(_hook(log, "kwargs", lambda mod, args, kwargs, out: None), with_kwargs=True)
    m[2].register_forward_hook(_hook(log, "always"), always_call=True)
    return m


class _Counting(nn.Module):
    """A hook that keeps Python state and calls another module."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.body = _model()
        self.side = nn.Linear(2, 2)
        self.calls = 0

        def count(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
            log.append("count")
            self.calls += 1
            return self.side(out)

        self.body.register_forward_hook(count)
        self.side.register_forward_pre_hook(_hook(log, "side_pre"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _state(log: list[str]) -> nn.Module:
    return _Counting(log)


MODELS = {"nested": _nested, "changing": _changing, "state": _state}


def _run(make: Callable[[list[str]], nn.Module], backend: str, traced: bool) -> dict[str, Any]:
    dynamo.reset()
    counters.clear()
    log: list[str] = []
    m = make(log)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    outs = []
    firsts: list[int] = []
    with hooktrace.trace(m) if traced else contextlib.nullcontext() as t:
        c = torch.compile(m, backend=backend)
        for _ in range(2):
            outs.append(c(x))
            firsts.append(len(log))
    return {
        "dynamo": (
            dict(counters["frames"]),
            dict(counters["stats"]),
            sum(counters["graph_break"].values()),
            dict(counters["recompiles"]),
        ),
        "outs": outs,
        "log": log,
        "first_call": log[: firsts[0]],
        "trace": t.trace if traced else None,
    }


def _compare(model: str, backend: str) -> None:
    plain = _run(MODELS[model], backend, traced=False)
    traced = _run(MODELS[model], backend, traced=True)
    assert traced["dynamo"] == plain["dynamo"]  # frames, graphs, breaks, captured calls, recompiles
    assert traced["log"] == plain["log"]
    for a, b in zip(plain["outs"], traced["outs"]):
        assert torch.equal(a, b)
    trace = traced["trace"]
    assert _order(trace) == plain["log"]  # every call, those inside the graph in program order
    assert any(e.graph is not None for e in trace.hook_events())
    assert not [s for s in trace.surprises if s.rule in ("never-fired", "compiled")]


def _order(trace: hooktrace.Trace) -> list[str]:
    """The record's labels of the trace's hook events, in the trace's order."""
    names = {h.id: h.name for h in trace.hooks}
    return [_alias(names[e.hook]) for e in trace.hook_events() if e.hook in names]


def _alias(name: str) -> str:
    """The record's label of a hook hooktrace names by its function (a partial, a callable object)."""
    return {
        "partial(_partial_pre)": "partial2",
        "_Labelled": "object2",
        "_Counting.__init__.<locals>.count": "count",
    }.get(name, name)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("model", list(MODELS))
def test_compiled_forward_hooks_named_in_order_same_graphs(
    model: str, backend: str, no_global_hooks: None
) -> None:
    _compare(model, backend)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_compiled_forward_inductor(no_global_hooks: None) -> None:
    _compare("changing", "inductor")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_compiled_forward_global_hooks(no_global_hooks: None) -> None:
    """A global forward hook under `torch.compile(m)` (it fires for the wrapper too, pytorch#149502)."""
    log: list[str] = []

    def make(log_: list[str]) -> nn.Module:
        return _nested(log_)

    handle = nn.modules.module.register_module_forward_pre_hook(_hook(log, "global_pre"))
    try:
        plain = _run(make, "eager", traced=False)
        traced = _run(make, "eager", traced=True)
    finally:
        handle.remove()
    assert traced["dynamo"] == plain["dynamo"]
    assert traced["log"] == plain["log"]
    assert log.count("global_pre") > 0
    assert [n for n in _order(traced["trace"]) if n != "global_pre"] == plain["log"]
    compiled = [e for e in traced["trace"].hook_events() if e.graph is not None]
    names = {h.id: h.name for h in traced["trace"].hooks}
    assert "global_pre" in {names[e.hook] for e in compiled}


def _global_run(backend: str, traced: bool) -> dict[str, Any]:
    """A global forward hook that records each module it runs for: `log` (appends Dynamo replays after
    the graph, as `log[:] = [...]`: an append made while the graph ran is overwritten) and `python`
    (only its calls as Python: Dynamo never traces that branch, so nothing replays or overwrites it)."""
    dynamo.reset()
    counters.clear()
    log: list[nn.Module] = []
    python: list[nn.Module] = []

    def gfwd(module: nn.Module, args: Any, out: Any) -> None:
        log.append(module)
        if not torch.compiler.is_compiling():
            python.append(module)

    model = _model()
    handle = nn.modules.module.register_module_forward_hook(gfwd)
    x = torch.randn(3, 4, requires_grad=True, generator=torch.Generator().manual_seed(1))
    try:
        compiled = torch.compile(model, backend=backend)
        with hooktrace.trace(model) if traced else contextlib.nullcontext() as t:
            for _ in range(2):
                compiled(x).sum().backward()
    finally:
        handle.remove()
    counted = (dict(counters["frames"]), dict(counters["stats"]), dict(counters["recompiles"]))
    paths = {id(m): p for p, m in model.named_modules()}
    paths[id(compiled)] = ""  # hooktrace names torch.compile's wrapper as the module it wraps
    return {
        "dynamo": counted,
        "log": [paths.get(id(m), type(m).__name__) for m in log],
        "python": [paths.get(id(m), type(m).__name__) for m in python],
        "trace": t.trace if traced else None,
    }


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_global_forward_hook_on_aot_graph_module_is_that_module(backend: str, no_global_hooks: None) -> None:
    """Under aot_eager, AOTAutograd's compiled forward is an FX GraphModule called as a module: a global
    forward hook really runs for it (its Python-only record has it; Dynamo's replay of the list append
    overwrites it in the other record). The trace shows that call on the GraphModule, named as
    torch.compile's, and every compiled hook call for the module it ran for (the GraphModule's call
    was taken for the first Linear's, which was then missing)."""
    plain = _global_run(backend, traced=False)
    traced = _global_run(backend, traced=True)
    assert traced["dynamo"] == plain["dynamo"]
    assert (traced["log"], traced["python"]) == (plain["log"], plain["python"])
    graph_module = "GraphModule" in plain["python"]
    if backend == "aot_eager" and not graph_module:
        # seen on 2.9.1 and 2.14.1 in runs of many test files (on 2.14.1 alone it is called):
        # what is traced equals the untraced run above; the case below needs that call
        pytest.skip("AOTAutograd did not call its forward as a module in this process")
    assert graph_module == (backend == "aot_eager")  # PyTorch's behaviour, the case of this test
    events = list(traced["trace"].hook_events())

    def where(e: Any) -> str:
        return "GraphModule" if e.module == "(torch.compile) GraphModule" else e.module

    assert [where(e) for e in events if e.graph is None] == plain["python"]
    assert [where(e) for e in events if e.module != "(torch.compile) GraphModule"] == plain["log"]
    assert [e.module for e in events if e.graph is not None] == ["0", "1", "2", ""] * 2
    assert not any(e.module and e.module.startswith("(outside)") for e in traced["trace"].events)


def _compiled_before(
    first_call_inside: bool, register_late: bool = False
) -> tuple[hooktrace.Trace, list[torch.Tensor], torch.Tensor]:
    """(the trace, the block's outputs, the model's output without hooks). The hooks add 1 to the
    output: no Python side effect, so nothing Dynamo guards changes from call to call (a list
    appended to would recompile at each call, pytorch/pytorch#93724)."""
    dynamo.reset()
    m = _model()
    x = torch.randn(3, 4)
    plain = m(x)
    if not register_late:
        m[2].register_forward_hook(lambda module, args, out: out + 1)
    compiled = torch.compile(m, backend="eager")
    if not first_call_inside:
        compiled(x)  # Dynamo compiles and caches the graph: before the block
    with hooktrace.trace(compiled) as t:
        outs = []
        if register_late:  # pytorch/pytorch#117758: no hook at the compile, no guard on the empty dicts
            outs.append(compiled(x))  # compiled inside the block, with no hook
            m[2].register_forward_hook(lambda module, args, out: out + 1)  # in no graph: never runs
        outs.append(compiled(x))
    return t.trace, outs, plain


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_graph_compiled_before_tracing_began_is_said_to_be(no_global_hooks: None) -> None:
    """The model's graph was compiled (and cached) before the block: the note says so plainly; the
    tree does not say that nothing ran a hook."""
    from hooktrace.render import render

    trace, outs, plain = _compiled_before(first_call_inside=False)
    assert torch.equal(outs[0], plain + 1)  # the hook ran, inside the cached graph
    (note,) = [s for s in trace.surprises if s.rule == "compiled"]
    assert note.message.startswith("compiled before tracing began: `<root>` ran code torch.compile compiled")
    assert "none ran a hook" not in render(trace, "tree", width=200)
    # nearest case: the first compiled call is inside the block: the graph's hooks are hook events
    trace, outs, plain = _compiled_before(first_call_inside=True)
    assert torch.equal(outs[0], plain + 1)
    assert [e.graph is not None for e in trace.hook_events()] == [True]
    assert not [s for s in trace.surprises if s.rule == "compiled"]
    # and a graph compiled in the block that holds none of a hook (registered after it): not "before"
    trace, outs, plain = _compiled_before(first_call_inside=True, register_late=True)
    assert torch.equal(outs[1], plain)  # the late hook never ran
    (note,) = [s for s in trace.surprises if s.rule == "compiled"]
    assert "before tracing began" not in note.message and "hold none of these hooks" in note.message


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _compile_in_block_then_after(traced: bool, how: str, backend: str) -> tuple[dict, dict]:
    """Dynamo's counters over three steps: in a block, after it, in a second block (or untraced)."""
    dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    m = _Net()
    m.a.register_forward_hook(lambda module, args, out: out * 2)
    m.register_forward_pre_hook(lambda module, args: None)
    if how == "method":
        m.compile(backend=backend)
        compiled: Any = m
    else:
        compiled = torch.compile(m, backend=backend)
    x = torch.randn(3, 4, requires_grad=True)
    for step in range(3):
        with hooktrace.trace(compiled) if traced and step != 1 else contextlib.nullcontext():
            compiled(x).sum().backward()
    return dict(counters["stats"]), dict(counters["frames"])


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("how", ["torch.compile(m)", "method"])
def test_a_graph_compiled_in_the_block_is_reused_after_it(
    no_global_hooks: None, how: str, backend: str
) -> None:
    """The module-call wrapper hands Dynamo PyTorch's `__call__` from a global, not its closure:
    Dynamo guarded on the closure, reached through `nn.Module.__call__`, and compiled the graph again
    once the block had put PyTorch's own back (2 graphs where untraced has 1, 3 frames for 2)."""
    traced = _compile_in_block_then_after(True, how, backend)
    assert traced == _compile_in_block_then_after(False, how, backend)
    assert traced[0]["unique_graphs"] == 1
