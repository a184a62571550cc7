"""torch.compile traced vs untraced: the same graphs, the same results, and every hook that ran as
Python in the trace, in the order the hooks recorded themselves.

The oracle is the hooks' own record: each hook appends `(label, torch.compiler.is_compiling())`.
Dynamo replays that append for a hook it compiled into a graph with `True` (it folds the call);
a hook called as Python appends `False` — when its own frame is not compiled by Dynamo, which the
exact-order tests ensure with `skip_code` on the hooks' code (it affects only frames run on their
own, never inlining into a graph). So the record says which hooks ran as Python (those hooktrace
must trace as Python calls, in that order) and which ran inside the graph (hook events of the
graph's runs, `Event.graph`), independently of hooktrace. With ordinary hooks (their frames compiled by Dynamo when
called as Python) the graphs, frames and results are compared too.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import pytest
import torch
from torch import nn

import hooktrace

dynamo = pytest.importorskip("torch._dynamo")
from torch._dynamo.testing import CompileCounter  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

Setup = Callable[[nn.Module, "Record"], None]
_INLINES_CALL_IMPL = torch.torch_version.TorchVersion(torch.__version__) >= "2.14"  # see _compare


class Record:
    """Hooks that log `(label, compiling)` and remember their handle ids."""

    def __init__(self, own_frames: bool) -> None:
        self.log: list[tuple[str, bool]] = []
        self.labels: dict[int, str] = {}
        self.own_frames = own_frames  # False: Dynamo never compiles a hook's frame on its own

    def hook(self, label: str) -> Callable[..., None]:
        log = self.log

        def hook(*args: Any) -> None:
            log.append((label, torch.compiler.is_compiling()))

        if not self.own_frames:
            dynamo.eval_frame.skip_code(hook.__code__)
        return hook

    def on(self, module: nn.Module, kind: str, label: str) -> None:
        register = {
            "forward_pre": module.register_forward_pre_hook,
            "forward": module.register_forward_hook,
            "backward_pre": module.register_full_backward_pre_hook,
            "backward": module.register_full_backward_hook,
        }[kind]
        self.labels[register(self.hook(label)).id] = label

    def python(self) -> list[str]:
        return [label for label, compiling in self.log if not compiling]

    def in_graph(self) -> set[str]:
        return {label for label, compiling in self.log if compiling}


class Net(nn.Module):
    """A model class of the user's (torch.compile wraps its `__call__`, not an inlined torch.nn one)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.last = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(torch.relu(self.first(x)))


def _subs(m: nn.Module) -> tuple[nn.Module, nn.Module]:
    return (m[0], m[2]) if isinstance(m, nn.Sequential) else (m.first, m.last)


def _sub_backward(m: nn.Module, r: Record) -> None:  # the case: a graph break at the first layer
    first, last = _subs(m)
    r.on(first, "backward", "bw0")
    r.on(first, "forward_pre", "pre0")
    r.on(last, "forward", "fwd2")


def _only_forward(m: nn.Module, r: Record) -> None:  # no graph break
    first, last = _subs(m)
    r.on(m, "forward_pre", "root_pre")
    r.on(first, "forward_pre", "pre0")
    r.on(last, "forward", "fwd2")
    r.on(m, "forward", "root_fwd")


def _root_and_subs(m: nn.Module, r: Record) -> None:  # backward hooks on the root and a submodule
    first, last = _subs(m)
    r.on(m, "forward_pre", "root_pre")
    r.on(m, "backward", "root_bw")
    r.on(last, "backward_pre", "bwpre2")
    r.on(last, "forward", "fwd2")
    r.on(first, "backward", "bw0")


SETUPS = {"sub_backward": _sub_backward, "only_forward": _only_forward, "root_and_subs": _root_and_subs}


def _model(setup: Setup, own_frames: bool = True, net: bool = False) -> tuple[nn.Module, Record]:
    torch.manual_seed(0)
    m = Net() if net else nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    r = Record(own_frames)
    setup(m, r)
    return m, r


def _run(setup: Setup, how: str, fullgraph: bool, traced: bool, own_frames: bool) -> dict[str, Any]:
    """Two compiled steps; what Dynamo did (counters, CompileCounter), results and the hooks' record.

    how: "wrapper" (`torch.compile(m)` inside the block), "before" (made before the block), "method"
    (`m.compile()`); a "-net" suffix uses a model class of the user's instead of nn.Sequential.
    """
    dynamo.reset()
    counters.clear()
    m, r = _model(setup, own_frames, net=how.endswith("-net"))
    how = how.removesuffix("-net")
    backend = CompileCounter()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
    seen: dict[str, Any] = {}

    early = torch.compile(m, backend=backend, fullgraph=fullgraph) if how == "before" else None

    def steps() -> None:
        if early is not None:
            c: nn.Module = early
        elif how == "wrapper":
            c = torch.compile(m, backend=backend, fullgraph=fullgraph)
        else:
            m.compile(backend=backend, fullgraph=fullgraph)
            c = m
        outs = []
        for _ in range(2):
            out = c(x)
            out.sum().backward()
            outs.append(out.detach())
        seen["tensors"] = [*outs, x.grad, *(p.grad for p in m.parameters())]

    try:
        if traced:
            with hooktrace.trace(m) as t:
                steps()
            seen["trace"] = t.trace
        else:
            steps()
    except Exception as exc:  # noqa: BLE001 - compared between the two runs
        seen["error"] = type(exc).__name__
    seen["dynamo"] = (
        backend.frame_count,
        backend.op_count,
        dict(counters["frames"]),
        dict(counters["stats"]),
    )
    seen["record"] = r
    return seen


def _compare(setup: str, how: str, fullgraph: bool, own_frames: bool) -> None:
    plain = _run(SETUPS[setup], how, fullgraph, False, own_frames)
    traced = _run(SETUPS[setup], how, fullgraph, True, own_frames)
    # the same graphs, frames and ops as untraced, and the same error where fullgraph cannot compile
    assert traced["dynamo"] == plain["dynamo"]
    assert traced.get("error") == plain.get("error")
    r_plain, r_traced = plain["record"], traced["record"]
    assert r_traced.log == r_plain.log  # the same hooks ran, the same way, in the same order
    if "error" in plain:
        return
    for a, b in zip(plain["tensors"], traced["tensors"]):
        assert torch.equal(a, b)  # bitwise
    trace = traced["trace"]
    order = [r_traced.labels[e.hook] for e in trace.events if e.type == "hook" and e.hook in r_traced.labels]
    if own_frames:  # the record cannot tell a hook inlined into a graph from one whose own frame compiled
        assert set(order) <= {label for label, _ in r_traced.log}
        return
    named = {r_traced.labels[h] for s in trace.surprises if s.rule == "compiled" for h in s.hooks}
    python = r_traced.python()
    # hook events of hooks that ran as Python; those inside a compiled graph carry its number
    as_python = [
        r_traced.labels[e.hook]
        for e in trace.events
        if e.type == "hook" and e.hook in r_traced.labels and e.graph is None
    ]
    if how.startswith("method") and _INLINES_CALL_IMPL:
        # From torch 2.14 `m.compile()` has Dynamo trace into the module's own `_call_impl`
        # (external_utils.wrap_inline): the hooks it calls at a graph break run from compiled code,
        # not through hooktrace's copy. Each hook that ran as Python is traced in order, or named by
        # the `compiled` surprise ("called from it"); every hook inside the graph is an event.
        assert as_python == [label for label in python if label not in named]
        assert named <= r_traced.in_graph() | set(python)
    else:
        # every hook that ran as Python is traced, in the order the hooks recorded themselves
        assert as_python == python
        # and every call inside a graph too: all of them in the record's order (Dynamo replays a
        # compiled hook's append in program order), so the `compiled` surprise has nothing to name
        assert order == [label for label, _ in r_traced.log]
        assert not named
    if not named:
        assert not [s for s in trace.surprises if s.rule == "compiled"]
    assert not [s for s in trace.surprises if s.rule == "never-fired"]


CASES = [
    (setup, how, fullgraph)
    for setup in SETUPS
    for how in ("wrapper", "before", "method", "wrapper-net", "before-net", "method-net")
    for fullgraph in (False, True)
]
QUICK = {
    ("sub_backward", "wrapper", False),
    ("only_forward", "method", True),
    ("root_and_subs", "before-net", False),
}


def _id(case: tuple) -> str:
    return f"{case[0]}-{case[1]}-{'fullgraph' if case[2] else 'breaks'}"


@pytest.mark.filterwarnings("ignore::UserWarning")  # Dynamo's graph-break and full-backward-hook warnings
@pytest.mark.parametrize("case", sorted(QUICK), ids=_id)
def test_compiled_model_same_graphs_python_hooks_traced_in_order(case: tuple, no_global_hooks: None) -> None:
    _compare(*case, own_frames=False)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("own_frames", [False, True], ids=["hook-frames-skipped", "hook-frames-compiled"])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_compiled_model_every_setup(case: tuple, own_frames: bool, no_global_hooks: None) -> None:
    _compare(*case, own_frames=own_frames)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_compiled_model_ordinary_hooks_same_graphs(no_global_hooks: None) -> None:
    """Hooks whose own frames Dynamo compiles when PyTorch calls them: still the same graphs and frames."""
    _compare("sub_backward", "wrapper", False, own_frames=True)


def _explain(m: nn.Module, x: torch.Tensor) -> tuple:
    e = dynamo.explain(m)(x)
    return e.graph_count, e.graph_break_count, e.op_count, [str(b.reason) for b in e.break_reasons]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("setup", list(SETUPS))
def test_dynamo_explain_gives_the_same_answer_inside_the_block(setup: str, no_global_hooks: None) -> None:
    x = torch.randn(3, 4)
    dynamo.reset()
    plain = _explain(_model(SETUPS[setup])[0], x)
    dynamo.reset()
    m = _model(SETUPS[setup])[0]
    with hooktrace.trace(m):
        traced = _explain(m, x)
    assert traced == plain


def test_only_hooktrace_code_is_hidden_from_dynamo() -> None:
    """The frames marked for Dynamo to skip are hooktrace's own, and the shims and the wrapper among them."""
    from hooktrace.capture import dynamo as own
    from hooktrace.capture import shims

    codes = own.own_codes(shims.SHIM_CODES)
    assert {c.co_name for c in codes} >= own.CALLS_USER_CODE
    for code in codes:
        assert code.co_filename.startswith((own._HERE, "<hooktrace")) or code.co_filename == "<string>", code


class _Caching(nn.Module):
    """A forward that registers a buffer and sets an attribute: Dynamo inlines Module's
    `register_buffer` / `__setattr__`, which are hooktrace's copies while the block is open."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layer(x)
        self.cache = y.detach()
        self.register_buffer("last", y.detach(), persistent=False)
        return y


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_compiled_forward_that_registers_a_buffer_compiles_the_same_traced(no_global_hooks: None) -> None:
    def run(traced: bool) -> tuple:
        dynamo.reset()
        torch.manual_seed(0)
        m = _Caching()
        backend = CompileCounter()
        c = torch.compile(m, backend=backend)
        x = torch.randn(1, 2, generator=torch.Generator().manual_seed(0))
        if traced:
            with hooktrace.trace(m):
                out = c(x)
        else:
            out = c(x)
        return backend.frame_count, backend.op_count, out, m.last

    plain, traced = run(False), run(True)  # traced, Dynamo's guard on the copies' globals used to fail
    assert plain[:2] == traced[:2]
    assert torch.equal(plain[2], traced[2]) and torch.equal(plain[3], traced[3])


class _Doubling(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.inner(x))


def _fullgraph_root_hook(model: nn.Module, traced: bool) -> dict[str, Any]:
    """`torch.compile(model, fullgraph=True)` with a forward hook on the root that doubles the output;
    the hook's own frame is never compiled on its own (skip_code), so a profiler that counts the calls
    of its code object counts exactly the calls that ran as Python."""
    import sys

    dynamo.reset()
    log: list[bool] = []

    def root_forward(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        log.append(torch.compiler.is_compiling())
        return out * 2

    dynamo.eval_frame.skip_code(root_forward.__code__)
    model.register_forward_hook(root_forward)
    c = torch.compile(model, backend="eager", fullgraph=True)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    python_calls = [0]

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code is root_forward.__code__:
            python_calls[0] += 1

    outs = []
    with hooktrace.trace(c) if traced else contextlib.nullcontext() as t:
        for _ in range(2):
            sys.setprofile(profile)
            try:
                outs.append(c(x))
            finally:
                sys.setprofile(None)
    return {"outs": outs, "log": log, "python": python_calls[0], "trace": t.trace if traced else None}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("cls", ["torch.nn", "user"])
def test_fullgraph_root_hook_is_a_python_call_only_when_it_ran_as_python(
    cls: str, no_global_hooks: None
) -> None:
    """Only what ran as Python is a Python hook call (issue 33 item 1). A torch.nn class is inlined
    whole by Dynamo (`wrap_inline`): the root hook runs inside the graph, 0 Python calls, and the
    trace has no Python hook call (one compiled hook event per graph run), no `returned`, no
    `replaced-value` and one module call per forward. A
    model class of the user's is run by PyTorch's `_call_impl` outside Dynamo (`torch.compile` wraps
    its bound `__call__`): the hook is called as Python, its returned value is used (the output is
    doubled untraced too), and the trace shows exactly those calls."""

    def make() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 4), nn.ReLU()) if cls == "torch.nn" else _Doubling()

    plain = _fullgraph_root_hook(make(), traced=False)
    traced = _fullgraph_root_hook(make(), traced=True)
    assert traced["python"] == plain["python"] and traced["log"] == plain["log"]
    for a, b in zip(plain["outs"], traced["outs"]):
        assert torch.equal(a, b)
    trace = traced["trace"]
    hook_events = [e for e in trace.events if e.type == "hook" and e.graph is None]
    in_graph = [e for e in trace.events if e.type == "hook" and e.graph is not None]
    enters = [e for e in trace.events if e.type == "enter" and e.module == ""]
    rules = {s.rule for s in trace.surprises}
    assert len(hook_events) == plain["python"]  # one Python call per call that ran as Python, no more
    if cls == "torch.nn":
        assert plain["python"] == 0 and plain["log"] == [True, True]
        assert len(enters) == 2 and "replaced-value" not in rules and "compiled" not in rules
        # the hook ran inside the graph at each forward: one compiled hook event per run, no time,
        # nothing returned that hooktrace could see
        assert len(in_graph) == 2 and not any(e.returned or e.duration_ns for e in in_graph)
    else:
        assert plain["python"] == 2 and plain["log"] == [False, False] and not in_graph
        assert all(e.returned for e in hook_events) and "replaced-value" in rules
        # two module calls per forward, as PyTorch makes them: torch.compile's wrapper (named as the
        # model) and the model's own `__call__`, in which its hooks run
        assert len(enters) == 4
