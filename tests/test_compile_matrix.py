"""torch.compile matrix (issue 32): small models of every common layer and hook kind, each compiled with
the `eager`, `aot_eager` and `inductor` backends, traced and untraced.

The oracle is the hooks' own record and Dynamo's word, none read from hooktrace: each hook appends
its name to a list as it runs (Dynamo replays the appends of the hooks it compiled into a graph right
after that graph runs), and, while Dynamo traces it, tells through `comptime` which graph it goes
into and which frame is compiled; the backend's compiled graphs record each of their runs (where
the list stood, the hooks Dynamo traced into that graph). A hook traced into a graph of its own frame
(Dynamo compiles the frames it is offered after a graph break) is called as Python.
Traced and untraced must give the same records, outputs, gradients and Dynamo counters (frames,
graphs, graph breaks, recompiles); the trace's Python hook events must be the Python calls, its graph
events the runs of graphs holding hooks, each with those hooks in order, and every hook event the
list's order.

Inductor is slow on a CPU: two cases run by default, the rest are marked slow.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import hooktrace

dynamo = pytest.importorskip("torch._dynamo")
from torch._dynamo.comptime import comptime  # noqa: E402
from torch._dynamo.symbolic_convert import InstructionTranslator  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),  # Dynamo's graph-break and backward-hook warnings
]


class Records:
    """What the hooks record of themselves: `log`, every call in order; `notes`, each hook Dynamo
    traced while compiling (name, the OutputGraph, the code of the frame compiled), told by Dynamo
    itself through `comptime`; `runs`, each run of a compiled graph (len(log) when it started, the
    hooks Dynamo traced into it)."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.notes: list[tuple[str, Any, Any]] = []
        self.runs: list[tuple[int, list[str]]] = []
        self.handles: list[Any] = []  # of global hooks, removed after the run
        NOTES[0] = self.notes

    def hook(self, name: str, result: Callable[..., Any] = lambda *a: None) -> Callable[..., Any]:
        log = self.log

        def hook(*args: Any, **kwargs: Any) -> Any:
            label = name
            log.append(label)
            if torch.compiler.is_compiling():
                comptime(_note)
            return result(*args)

        hook.__name__ = hook.__qualname__ = name
        return hook

    def partial(self, name: str) -> Callable[..., Any]:
        return functools.partial(_partial_hook, self.log, name)

    def expected(self) -> tuple[list[str], list[list[str]], list[str]]:
        """(the Python calls, the hooks of each run of a graph that holds any, every call) as the
        records give them. Dynamo replays a graph's hooks' appends right after the graph runs, so
        each run's hooks are the slice of `log` that begins where the log stood when it started."""
        inlined: set[int] = set()
        runs = []
        for at, hooks in self.runs:
            if hooks:
                assert self.log[at : at + len(hooks)] == hooks  # the records agree with each other
                inlined.update(range(at, at + len(hooks)))
                runs.append(hooks)
        python = [name for i, name in enumerate(self.log) if i not in inlined]
        return python, runs, list(self.log)


NOTES: list[list[tuple[str, Any, Any]]] = [[]]


def _partial_hook(log: list[str], name: str, *args: Any) -> None:
    label = name
    log.append(label)
    if torch.compiler.is_compiling():
        comptime(_note)


class _Callable:
    """A callable object as a hook."""

    def __init__(self, r: Records, name: str) -> None:
        self.log, self.name = r.log, name

    def __call__(self, *args: Any) -> None:
        label = self.name
        self.log.append(label)
        if torch.compiler.is_compiling():
            comptime(_note)


HOOK_CODES = {Records.hook(Records(), "").__code__, _partial_hook.__code__, _Callable.__call__.__code__}


def _note(ctx: Any) -> None:
    """At compile time (comptime): the hook Dynamo is tracing, the graph it goes into, and the frame."""
    tx = ctx._i_will_not_complain_if_bc_breaks_InstructionTranslator()
    NOTES[0].append((ctx.get_local("label").as_python_constant(), tx.output, tx.output.root_tx.f_code))


def _backend(name: str, r: Records) -> Callable[..., Any]:
    """Dynamo's backend `name`, whose compiled graphs record each run with the hooks Dynamo traced
    into that graph (none when the frame compiled is a hook's own: Dynamo compiles the frames it is
    offered after a graph break, and the hook is then called as Python)."""
    inner = dynamo.lookup_backend(name)

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        fn = inner(gm, example_inputs)
        output = InstructionTranslator.current_tx().output
        hooks = [n for n, graph, code in r.notes if graph is output and code not in HOOK_CODES]

        def run(*args: Any) -> Any:
            r.runs.append((len(r.log), hooks))
            return fn(*args)

        if getattr(fn, "_boxed_call", False):
            run._boxed_call = True  # type: ignore[attr-defined]
        return run

    return backend


# ---- the models: each takes the records, returns (model, input) ----


def _linear(r: Records) -> tuple[nn.Module, torch.Tensor]:
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    m[0].register_forward_pre_hook(r.hook("pre0", lambda mod, args: (args[0] * 2,)))
    m[0].register_forward_hook(r.hook("fwd0"))
    m[2].register_forward_hook(r.hook("fwd2", lambda mod, args, out: out + 1))
    m.register_forward_hook(r.hook("root"))
    m[2].register_full_backward_hook(r.hook("bwd2"))
    return m, torch.randn(3, 4)


def _conv(r: Records) -> tuple[nn.Module, torch.Tensor]:
    m = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten())
    m[0].register_forward_hook(r.hook("conv"))
    m[1].register_forward_pre_hook(r.hook("bn_pre"))
    m[3].register_forward_hook(r.hook("flat"))
    return m, torch.randn(2, 2, 5, 5)


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.inner(x))


def _residual(r: Records) -> tuple[nn.Module, torch.Tensor]:
    m = nn.Sequential(_Residual(), _Residual())
    for i in range(2):
        m[i].register_forward_pre_hook(r.hook(f"block{i}_pre"))
        m[i].inner.register_forward_hook(r.hook(f"inner{i}"))
    m[1].register_forward_hook(r.hook("block1"))
    return m, torch.randn(3, 4)


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True)
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.attn(x, x, x, need_weights=False)
        return self.proj(out)


def _attention(r: Records) -> tuple[nn.Module, torch.Tensor]:
    m = _Attention()
    m.attn.register_forward_pre_hook(r.hook("attn_pre"))
    m.attn.register_forward_hook(r.hook("attn"))
    m.proj.register_forward_hook(r.hook("proj"))
    return m, torch.randn(2, 3, 4)


def _layernorm(r: Records) -> tuple[nn.Module, torch.Tensor]:
    m = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    m[1].register_forward_hook(r.hook("ln_scale", lambda mod, args, out: out * 0.5))
    m[1].register_forward_pre_hook(r.hook("ln_pre"))
    return m, torch.randn(3, 4)


class _Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids))


def _embedding(r: Records) -> tuple[nn.Module, torch.Tensor]:
    m = _Embed()
    m.emb.register_forward_hook(r.hook("emb"))
    m.head.register_forward_pre_hook(r.hook("head_pre"))
    return m, torch.tensor([[1, 2, 3], [4, 5, 6]])


class _Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(4, 4, batch_first=True)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.head(out[:, -1])


def _gru(r: Records) -> tuple[nn.Module, torch.Tensor]:
    m = _Recurrent()
    m.gru.register_forward_hook(r.hook("gru"))
    m.head.register_forward_hook(r.hook("head"))
    return m, torch.randn(2, 3, 4)


class _Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.block, x, use_reentrant=False))


def _checkpointed(r: Records) -> tuple[nn.Module, torch.Tensor]:
    m = _Checkpointed()
    m.block[0].register_forward_hook(r.hook("ckpt_fc"))
    m.head.register_forward_hook(r.hook("head"))
    return m, torch.randn(3, 4)


def _kwargs(r: Records) -> tuple[nn.Module, torch.Tensor]:
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    m[0].register_forward_pre_hook(r.hook("kw_pre", lambda mod, args, kwargs: None), with_kwargs=True)
    m[0].register_forward_hook(r.hook("kw_fwd", lambda mod, args, kwargs, out: None), with_kwargs=True)
    m[1].register_forward_hook(r.hook("always"), always_call=True)
    return m, torch.randn(3, 4)


def _prepend(r: Records) -> tuple[nn.Module, torch.Tensor]:
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    m[0].register_forward_hook(r.hook("second"))
    m[0].register_forward_hook(r.hook("first"), prepend=True)
    m[0].register_forward_pre_hook(r.hook("pre_second"))
    m[0].register_forward_pre_hook(r.hook("pre_first"), prepend=True)
    return m, torch.randn(3, 4)


class _TensorHooks(nn.Module):
    def __init__(self, r: Records) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)
        self.grad_hook = r.hook("grad_mid")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mid = self.fc(x)
        if mid.requires_grad:
            mid.register_hook(self.grad_hook)
        return self.out(mid.relu())


def _tensor_hooks(r: Records) -> tuple[nn.Module, torch.Tensor]:
    m = _TensorHooks(r)
    m.fc.weight.register_hook(r.hook("grad_w"))
    m.out.register_forward_hook(r.hook("out"))
    return m, torch.randn(3, 4)


def _post_accumulate(r: Records) -> tuple[nn.Module, torch.Tensor]:
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    m[0].weight.register_post_accumulate_grad_hook(r.hook("acc_w0"))
    m[1].bias.register_post_accumulate_grad_hook(r.hook("acc_b1"))
    m[1].register_forward_hook(r.hook("fwd1"))
    return m, torch.randn(3, 4)


def _global(r: Records) -> tuple[nn.Module, torch.Tensor]:
    # under aot_eager they fire for AOTAutograd's GraphModule too (a Python call whose append Dynamo's
    # replay of the graph's appends overwrites: not in the list, see _GRAPH_MODULE)
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    r.handles.append(nn.modules.module.register_module_forward_pre_hook(r.hook("global_pre")))
    r.handles.append(nn.modules.module.register_module_forward_hook(r.hook("global_fwd")))
    m[0].register_forward_hook(r.hook("fwd0"))
    return m, torch.randn(3, 4)


def _objects(r: Records) -> tuple[nn.Module, torch.Tensor]:  # callable objects and partials
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    m[0].register_forward_pre_hook(r.partial("partial_pre"))
    m[0].register_forward_hook(_Callable(r, "object_fwd"))
    m[1].register_forward_hook(r.partial("partial_fwd"))
    return m, torch.randn(3, 4)


class _Stateful(nn.Module):
    """A hook that keeps Python state and calls another module (whose own hook runs inside it)."""

    def __init__(self, r: Records) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.side = nn.Linear(4, 4)
        self.calls = 0
        count = r.hook("count")

        def call_side(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
            count()
            self.calls += 1
            return self.side(out)

        self.body.register_forward_hook(call_side)
        self.side.register_forward_pre_hook(r.hook("side_pre"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _stateful(r: Records) -> tuple[nn.Module, torch.Tensor]:
    return _Stateful(r), torch.randn(3, 4)


def _graph_break(r: Records) -> tuple[nn.Module, torch.Tensor]:
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    note = r.hook("breaks")

    def breaks(module: nn.Module, args: Any, out: Any) -> None:
        note()
        torch._dynamo.graph_break()

    m[0].register_forward_pre_hook(r.hook("pre0"))
    m[1].register_forward_hook(breaks)
    m[2].register_forward_hook(r.hook("fwd2"))
    return m, torch.randn(3, 4)


MODELS: dict[str, Callable[[Records], tuple[nn.Module, torch.Tensor]]] = {
    "linear": _linear,
    "conv": _conv,
    "residual": _residual,
    "attention": _attention,
    "layernorm": _layernorm,
    "embedding": _embedding,
    "gru": _gru,
    "checkpoint": _checkpointed,
    "kwargs": _kwargs,
    "prepend": _prepend,
    "tensor_hooks": _tensor_hooks,
    "post_accumulate": _post_accumulate,
    "global": _global,
    "objects": _objects,
    "stateful": _stateful,
    "graph_break": _graph_break,
}


def _run(model: str, backend: str, traced: bool) -> dict[str, Any]:
    dynamo.reset()
    counters.clear()
    r = Records()
    torch.manual_seed(0)
    m, x = MODELS[model](r)
    compiled = torch.compile(m, backend=_backend(backend, r))
    outs = []
    try:
        with hooktrace.trace(m) if traced else contextlib.nullcontext() as t:
            for _ in range(2):
                out = compiled(x)
                out.sum().backward()
                outs.append(out.detach())
    finally:
        for handle in r.handles:
            handle.remove()
    return {
        "dynamo": (
            dict(counters["frames"]),
            dict(counters["stats"]),
            sum(counters["graph_break"].values()),
            dict(counters["recompiles"]),
        ),
        "tensors": [*outs, *(p.grad for p in m.parameters())],
        "records": (r.log, r.runs),
        "expected": r.expected(),
        "trace": t.trace if traced else None,
    }


def _check(model: str, backend: str) -> None:
    plain = _run(model, backend, traced=False)
    traced = _run(model, backend, traced=True)
    assert traced["dynamo"] == plain["dynamo"]  # frames, graphs, graph breaks, recompiles
    assert traced["records"] == plain["records"]
    for a, b in zip(plain["tensors"], traced["tensors"]):
        assert torch.equal(a, b)
    python, runs, order = plain["expected"]
    trace = traced["trace"]
    names = {h.id: _label(h) for h in trace.hooks}
    ours = {i for i, name in names.items() if name in set(traced["records"][0])}  # not checkpoint's own
    events = [e for e in trace.hook_events() if e.hook in ours and e.module != _GRAPH_MODULE]
    assert [names[e.hook] for e in events if e.graph is None] == python
    graphs = list(trace.graph_events())
    in_graph = [
        [names[e.hook] for e in events if e.graph is not None and e.seq in span] for span in _spans(trace)
    ]
    assert in_graph == runs
    assert len(graphs) == len(runs)
    assert [names[e.hook] for e in events] == order
    assert not [s for s in trace.surprises if s.rule in ("never-fired", "compiled")]


def _label(hook: Any) -> str:
    """The record's label of a hook of the trace (hooktrace names a hook by its function: a partial,
    an object; `outer → inner` for a closure around exactly one other function, the recording one)."""
    base = hook.name.split("→")[-1].strip().rsplit(".", 1)[-1]
    if hook.name.startswith("partial(") or base == "_Callable":
        return {
            ("forward_pre", "0"): "partial_pre",
            ("forward", "0"): "object_fwd",
            ("forward", "1"): "partial_fwd",
        }[(hook.kind, hook.module)]
    return base


def _spans(trace: hooktrace.Trace) -> list[range]:
    """The event seqs of each graph event's hooks: from it to the next graph event."""
    starts = [e.seq for e in trace.graph_events()]
    return [range(a, b) for a, b in zip(starts, [*starts[1:], len(trace.events)])]


_GRAPH_MODULE = (
    "(torch.compile) GraphModule"  # global hooks' Python call for it: test_capture_compile_forward
)
INDUCTOR_QUICK = {"residual", "tensor_hooks", "global"}


def _cases() -> list[Any]:
    cases = []
    for model in MODELS:
        for backend in ("eager", "aot_eager", "inductor"):
            slow = backend == "inductor" and model not in INDUCTOR_QUICK
            marks = [pytest.mark.slow] if slow else []
            cases.append(pytest.param(model, backend, marks=marks, id=f"{model}-{backend}"))
    return cases


@pytest.mark.parametrize(("model", "backend"), _cases())
def test_compiled_hooks_in_the_hooks_own_order(model: str, backend: str, no_global_hooks: None) -> None:
    _check(model, backend)
