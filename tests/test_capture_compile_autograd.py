"""Compiled autograd traced vs untraced: Dynamo compiles the same backward graphs (the same frames,
graphs, graph breaks and captures), the results and the hooks' own record are the same, and every
hook call, those that ran inside the graph included, is a hook event in the order the hooks recorded
themselves.

The oracle is the hooks' own record (each appends its label as it runs). Before the fix, Dynamo
inlined hooktrace's shims into the compiled-autograd graph and broke it at `time.perf_counter_ns`
(26 graph breaks and 31 frames traced where the untraced backward has 8 and 13).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.capture import compiled

dynamo = pytest.importorskip("torch._dynamo")
from torch._dynamo import compiled_autograd  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402


def _labelled(log: list[str], label: str) -> Callable[..., None]:
    def hook(*args: Any) -> None:
        log.append(label)

    hook.__name__ = hook.__qualname__ = label
    return hook


def _run(traced: bool, multi_grad: Optional[str]) -> dict[str, Any]:
    dynamo.reset()
    counters.clear()
    log: list[str] = []
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    m[0].weight.register_hook(_labelled(log, "grad_w0"))
    m[2].weight.register_post_accumulate_grad_hook(_labelled(log, "acc_w2"))
    m[2].register_full_backward_hook(_labelled(log, "backward_2"))
    m[0].register_full_backward_pre_hook(_labelled(log, "backward_pre_0"))
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
    outs = []
    with hooktrace.trace(m) if traced else contextlib.nullcontext() as t:
        for step in range(2):
            out = m(x)
            out.grad_fn.register_hook(_labelled(log, f"node_{step}"))
            out.grad_fn.register_prehook(_labelled(log, f"node_pre_{step}"))
            if multi_grad:
                torch.autograd.graph.register_multi_grad_hook(
                    (m[0].bias, m[2].bias), _labelled(log, "multi"), mode=multi_grad
                )
            with compiled_autograd._enable(torch.compile(backend="eager")):
                out.sum().backward()
            outs.append(out.detach())
    return {
        "dynamo": (
            dict(counters["frames"]),
            dict(counters["stats"]),
            sum(counters["graph_break"].values()),
            dict(counters["compiled_autograd"]),
        ),
        "tensors": [*outs, x.grad, *(p.grad for p in m.parameters())],
        "log": log,
        "trace": t.trace if traced else None,
    }


@pytest.mark.filterwarnings("ignore::UserWarning")  # Dynamo's graph-break and full-backward-hook warnings
@pytest.mark.parametrize(
    "multi_grad", [None, "all", "any"], ids=["graph-whole", "multi-grad-all-breaks", "multi-grad-any-breaks"]
)
def test_compiled_autograd_same_graphs_and_hooks_in_order(
    multi_grad: Optional[str], no_global_hooks: None
) -> None:
    # torch 2.8 offers Dynamo the frames of typing's first subscription of a generic (cached after:
    # 14 frames, 2 of them failing, in a process's first multi-grad run), which 2.13 skips: a run
    # before the two compared leaves both with the same typing caches
    _run(traced=False, multi_grad=multi_grad)
    plain = _run(traced=False, multi_grad=multi_grad)
    traced = _run(traced=True, multi_grad=multi_grad)
    assert traced["dynamo"] == plain["dynamo"]  # frames, graphs, graph breaks, captures
    assert traced["log"] == plain["log"]
    for a, b in zip(plain["tensors"], traced["tensors"]):
        assert torch.equal(a, b)
    trace = traced["trace"]
    names = {h.id: h.name for h in trace.hooks}
    # every hook call, those inside the compiled-autograd graph included, in the record's order; the
    # multi-grad hook runs as Python after its graph break (PyTorch's inner hook, which Dynamo does
    # not trace, calls it at the last of its tensors' slots in mode "all", the first in "any")
    assert [names[e.hook] for e in trace.hook_events()] == plain["log"]
    runs = list(trace.graph_events())
    assert len(runs) == 2 and all(e.phase == "backward" for e in runs)  # one per backward
    in_graph = [e for e in trace.hook_events() if e.graph is not None]
    assert in_graph and all(e.duration_ns == 0 and e.graph in {r.graph for r in runs} for e in in_graph)
    assert not [s for s in trace.surprises if s.rule in ("never-fired", "compiled")]
    python_hooks = [e for e in trace.hook_events() if e.graph is None]
    if multi_grad:  # one event per call of the multi-grad hook
        # as Python on torch 2.13 (Dynamo breaks the graph at PyTorch's inner hook); torch 2.8's
        # Dynamo compiles the inner hook, so the user's function ran inside the graph
        as_python = not compiled._MULTI_GRAD_IN_GRAPH
        multi = [e for e in trace.hook_events() if names[e.hook] == "multi"]
        assert [e.kind for e in multi] == ["multi_grad"] * plain["log"].count("multi")
        assert [e.graph is None for e in multi] == [as_python] * len(multi)
        assert python_hooks == (multi if as_python else [])
        assert plain["log"].count("multi") == 3  # one hook in the first backward, two in the second
    else:
        assert not python_hooks


def test_an_eager_capture_does_not_import_dynamo(tmp_path: Any) -> None:
    """The compiled-autograd patch is installed only when Dynamo is already imported."""
    import subprocess
    import sys

    script = tmp_path / "eager.py"
    script.write_text(
        "import sys, torch, hooktrace\n"
        "m = torch.nn.Linear(2, 2)\n"
        "m.register_forward_hook(lambda *a: None)\n"
        "with hooktrace.trace(m):\n"
        "    m(torch.randn(1, 2)).sum().backward()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def _compiled_before(when: str) -> dict[str, Any]:
    """Three backward passes under compiled autograd, the same autograd graph each time (PyTorch
    compiles it at the first two and reuses the second's). `when`: "before" (the first two
    untraced: the graph the third runs was compiled before any capture), "inside" (all three in one
    block each), "earlier" (the second in an earlier capture); "untraced" (none traced)."""
    dynamo.reset()
    counters.clear()
    log: list[str] = []
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    m[0].register_full_backward_hook(_labelled(log, "backward_0"))
    m[2].weight.register_hook(_labelled(log, "grad_w2"))
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)

    def step() -> None:
        out = m(x)
        with compiled_autograd._enable(torch.compile(backend="eager")):
            out.sum().backward()

    traced = {"before": (2,), "inside": (0, 1, 2), "earlier": (1, 2), "untraced": ()}[when]
    trace = None
    for i in range(3):
        with hooktrace.trace(m) if i in traced else contextlib.nullcontext() as t:
            step()
        if i == 2 and i in traced:
            trace = t.trace
    return {
        "dynamo": (dict(counters["frames"]), dict(counters["stats"]), dict(counters["compiled_autograd"])),
        "log": log,
        "grads": [x.grad, *(p.grad for p in m.parameters())],
        "trace": trace,
    }


@pytest.mark.filterwarnings("ignore::UserWarning")  # the full-backward-hook warning (x needs grad)
@pytest.mark.parametrize("when", ["before", "inside", "earlier"])
def test_a_compiled_autograd_graph_compiled_before_tracing_is_said_not_guessed(
    when: str, no_global_hooks: None
) -> None:
    """A backward graph that compiled autograd compiled before any capture is reused from PyTorch's
    cache: its hooks run inside it and hooktrace, which reads a graph's hooks when it is compiled,
    cannot see them. never-fired said "no backward hook fired at all, so the trace does not show
    whether a backward pass ran" (one did); it now names that graph. The nearest cases: the graph
    compiled inside the block, or in an earlier capture, whose runs are traced, with no such reason."""
    plain, traced = _compiled_before("untraced"), _compiled_before(when)
    assert plain["dynamo"] == traced["dynamo"] and plain["log"] == traced["log"]
    # compiled at the first two backward passes (the second with dynamic sizes), reused at the third
    assert plain["dynamo"][2]["captures"] == 2
    for a, b in zip(plain["grads"], traced["grads"]):
        assert torch.equal(a, b)
    trace = traced["trace"]
    names = [trace.hook(e.hook).name for e in trace.hook_events()]
    silent = [s for s in trace.surprises if s.rule == "never-fired"]
    if when == "before":
        assert names == []
        [said] = silent
        assert said.level == "info"
        assert compiled.UNSEEN_GRAPH in said.message and "whether a backward pass ran" not in said.message
        assert {trace.hook(h).name for h in said.hooks} == {"backward_0", "grad_w2"}
    else:
        assert names == traced["log"][-2:]  # in the order they ran
        assert sorted(names) == ["backward_0", "grad_w2"]
        assert not silent
