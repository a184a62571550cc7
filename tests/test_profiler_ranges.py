"""Hooks in torch.profiler traces (docs/contract.md, Python API): under an active profiler, each traced hook call is a
`record_function` range `hook <kind> <name>`, nested where the hook ran; without a profiler no range
is made; `run --profile PATH` writes the profiler's Chrome trace."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import hooktrace
from hooktrace.capture import shims

# torch 2.11 and 2.12 warn once at a plain profile()'s end that events are cleared per cycle
pytestmark = pytest.mark.filterwarnings("ignore:Warning. Profiler clears events:UserWarning")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 4)
        self.fc2 = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def hooked(calls: list[str]) -> Net:
    """Hooks that record their own calls (the oracle) and each run one recognisable operator."""
    torch.manual_seed(0)
    net = Net()

    def scale_input(module: Any, args: tuple) -> Any:
        calls.append("forward_pre")
        return (args[0] * 2.0,)  # aten::mul, inside the hook's range

    def clamp_output(module: Any, args: tuple, out: torch.Tensor) -> torch.Tensor:
        calls.append("forward")
        return out.clamp(-10.0, 10.0)  # aten::clamp

    def grad_seen(module: Any, grad_in: tuple, grad_out: tuple) -> None:
        calls.append("backward")
        grad_out[0].abs()  # aten::abs, on the autograd thread

    def weight_grad(grad: torch.Tensor) -> torch.Tensor:
        calls.append("grad")
        return grad.neg()  # aten::neg

    net.fc1.register_forward_pre_hook(scale_input)
    net.fc1.register_forward_hook(clamp_output)
    net.fc2.register_full_backward_hook(grad_seen)
    net.fc1.weight.register_hook(weight_grad)
    return net


def profile_run(tmp_path: Path) -> tuple[dict, Any, list[str], torch.Tensor]:
    calls: list[str] = []
    net = hooked(calls)
    x = torch.randn(3, 4)
    with hooktrace.trace(net) as t:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = net(x)
            out.sum().backward()
    path = tmp_path / "profile.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text()), t.trace, calls, net.fc1.weight.grad.clone()


def _ranges(chrome: dict) -> list[dict]:
    return [
        e for e in chrome["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith("hook ")
    ]


def _inside(outer: dict, inner: dict) -> bool:
    return (
        outer["tid"] == inner["tid"]
        and outer["ts"] <= inner["ts"]
        and inner["ts"] + inner.get("dur", 0) <= outer["ts"] + outer["dur"] + 1
    )


def test_each_hook_call_is_a_range_named_by_kind_and_name(tmp_path: Path) -> None:
    chrome, trace, calls, _ = profile_run(tmp_path)
    ranges = _ranges(chrome)
    expected = [f"hook {e.kind} {trace.hook(e.hook).name}" for e in trace.events if e.type == "hook"]
    assert sorted(r["name"] for r in ranges) == sorted(expected)
    assert sorted(r["name"].split()[1] for r in ranges) == sorted(calls), "one range per call the hooks saw"
    names = {r["name"] for r in ranges}
    assert "hook forward_pre hooked.<locals>.scale_input" in names
    assert "hook grad hooked.<locals>.weight_grad" in names


@pytest.mark.parametrize(
    ("kind", "op"),
    [
        ("forward_pre", "aten::mul"),
        ("forward", "aten::clamp"),
        ("backward", "aten::abs"),
        ("grad", "aten::neg"),
    ],
)
def test_the_operator_a_hook_ran_is_inside_its_range(tmp_path: Path, kind: str, op: str) -> None:
    chrome, _, _, _ = profile_run(tmp_path)
    (hook_range,) = [r for r in _ranges(chrome) if r["name"].split()[1] == kind]
    ops = [e for e in chrome["traceEvents"] if e.get("ph") == "X" and e.get("name") == op]
    assert any(_inside(hook_range, o) for o in ops), f"{op} not nested in {hook_range['name']}"


def test_profiled_traced_run_computes_the_same(tmp_path: Path) -> None:
    _, _, calls, grad = profile_run(tmp_path)
    plain: list[str] = []
    net = hooked(plain)  # seeded: the same weights, then the same input as profile_run drew
    net(torch.randn(3, 4)).sum().backward()
    assert calls == plain
    assert torch.equal(net.fc1.weight.grad, grad)


def test_no_range_without_a_profiler(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any) -> None:
        raise AssertionError("a range was opened with no profiler active")

    monkeypatch.setattr(shims, "ranged", refuse)  # for shims made from here on, through the namespace
    calls: list[str] = []
    net = hooked(calls)
    with hooktrace.trace(net) as t:
        net(torch.randn(3, 4)).sum().backward()
    assert len([e for e in t.trace.events if e.type == "hook"]) == len(calls) == 4


def test_cli_profile_writes_the_profilers_chrome_trace(tmp_path: Path) -> None:
    from tests.test_cli import invoke

    code, _, err = invoke(
        "run",
        "samples/quickstart.py",
        "-o",
        str(tmp_path / "run.json"),
        "--profile",
        str(tmp_path / "prof.json"),
    )
    assert code == 0, err
    chrome = json.loads((tmp_path / "prof.json").read_text())
    trace = hooktrace.load(tmp_path / "run.json")
    names = sorted(r["name"] for r in _ranges(chrome))
    assert names == sorted(
        f"hook {e.kind} {trace.hook(e.hook).name}" for e in trace.events if e.type == "hook"
    )
    assert any(e.get("name") == "aten::linear" for e in chrome["traceEvents"]), "the operators are there too"


def test_cli_profile_into_a_missing_folder_is_a_usage_error(tmp_path: Path) -> None:
    from tests.test_cli import invoke

    code, _, err = invoke("run", "samples/quickstart.py", "--profile", str(tmp_path / "nope" / "p.json"))
    assert code == 2 and err.startswith("error:") and "does not exist" in err


def _module_ranges(chrome: dict, prefix: str) -> list[dict]:
    return [
        e for e in chrome["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith(prefix)
    ]


def test_module_ranges_before_inside_and_after_a_traced_block(tmp_path: Path) -> None:
    """PyTorch names module calls by `nn.Module.__call__`'s code, which hooktrace replaces in its
    block: inside it, the wrapper's own `module <path> (<Class>)` ranges hold the hook ranges, and
    PyTorch's `nn.Module:` ranges are back after it."""
    calls: list[str] = []
    net = hooked(calls)
    x = torch.randn(3, 4)

    def profiled(name: str) -> dict:
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True
        ) as prof:
            net(x).sum().backward()
        path = tmp_path / f"{name}.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())

    before = profiled("before")
    with hooktrace.trace(net):
        inside = profiled("inside")
    after = profiled("after")
    for chrome in (before, after):
        names = {r["name"] for r in _module_ranges(chrome, "nn.Module: ")}
        assert {"nn.Module: Net_0", "nn.Module: Linear_0", "nn.Module: Linear_1"} <= names
        assert not _module_ranges(chrome, "module ")
    modules = {r["name"]: r for r in _module_ranges(inside, "module ")}
    assert set(modules) == {"module <root> (Net)", "module fc1 (Linear)", "module fc2 (Linear)"}
    forward_hooks = [r for r in _ranges(inside) if r["name"].split()[1] in ("forward_pre", "forward")]
    assert len(forward_hooks) == 2
    for hook in forward_hooks:
        assert _inside(modules["module fc1 (Linear)"], hook), hook["name"]
        assert _inside(modules["module <root> (Net)"], hook), hook["name"]
    assert calls == ["forward_pre", "forward", "backward", "grad"] * 3


def test_cli_profile_has_module_ranges_holding_the_hook_ranges(tmp_path: Path) -> None:
    from tests.test_cli import invoke

    code, _, err = invoke(
        "run",
        "samples/quickstart.py",
        "-o",
        str(tmp_path / "run.json"),
        "--profile",
        str(tmp_path / "prof.json"),
    )
    assert code == 0, err
    chrome = json.loads((tmp_path / "prof.json").read_text())
    modules = _module_ranges(chrome, "module ")
    trace = hooktrace.load(tmp_path / "run.json")
    assert len(modules) == len([e for e in trace.events if e.type == "enter"])
    forward = [r for r in _ranges(chrome) if r["name"].split()[1] in ("forward_pre", "forward")]
    assert forward and all(any(_inside(m, h) for m in modules) for h in forward)


def test_the_trace_holds_its_clock_anchor(tmp_path: Path) -> None:
    import time

    net = hooked([])
    unix0, perf0 = time.time_ns(), time.perf_counter_ns()
    with hooktrace.trace(net) as t:
        net(torch.randn(3, 4))
    unix1, perf1 = time.time_ns(), time.perf_counter_ns()
    meta = t.trace.meta
    assert meta.clock_perf_ns is not None and meta.clock_unix_ns is not None
    assert perf0 <= meta.clock_perf_ns <= perf1 and unix0 <= meta.clock_unix_ns <= unix1
    t.trace.save(tmp_path / "t.json")
    again = hooktrace.load(tmp_path / "t.json")
    assert (again.meta.clock_perf_ns, again.meta.clock_unix_ns) == (meta.clock_perf_ns, meta.clock_unix_ns)


def _aligned_hooks(merged: dict, trace: Any) -> list[tuple[dict, dict]]:
    """(hooktrace's hook event, the profiler's range it matched) in each hook's call order."""
    names = {h.name: h for h in trace.hooks}
    ours = sorted(
        (
            e
            for e in merged["traceEvents"]
            if e.get("ph") == "X" and e.get("name") in names and "seq" in e.get("args", {})
        ),
        key=lambda e: e["ts"],
    )
    pairs = []
    for e in ours:
        label = f"hook {e['args']['kind']} {e['name']}"
        theirs = sorted((r for r in _ranges(merged) if r["name"] == label), key=lambda r: r["ts"])
        nth = sum(1 for p, _ in pairs if p["name"] == e["name"])
        pairs.append((e, theirs[nth]))
    return pairs


def _centred(ours: dict, theirs: dict, slack_us: float = 50.0) -> bool:
    """One span holds the other, give or take `slack_us` (the aligned clocks' jitter): hooktrace's
    clock reads enclose the range's opening and closing, and a thread preempted inside the hook makes
    both longer, not always by the same amount."""

    def holds(a: dict, b: dict) -> bool:
        return a["ts"] - slack_us <= b["ts"] and b["ts"] + b["dur"] <= a["ts"] + a["dur"] + slack_us

    return holds(ours, theirs) or holds(theirs, ours)


def test_merged_profile_places_each_hook_inside_its_profiler_range(tmp_path: Path) -> None:
    from hooktrace.render.merged import merge_profile

    chrome, trace, calls, _ = profile_run(tmp_path)
    merged = merge_profile(trace, chrome)
    pairs = _aligned_hooks(merged, trace)
    assert len(pairs) == len(calls) == 4
    for ours, theirs in pairs:
        assert _centred(ours, theirs), (ours["name"], ours["ts"], ours["dur"], theirs["ts"], theirs["dur"])
    assert abs(merged["otherData"]["hooktrace_offset_us"]) < 5_000, "the anchor alone is close"
    assert len(merged["traceEvents"]) > len(chrome["traceEvents"])


def test_cli_profile_merges_hooktraces_events(tmp_path: Path) -> None:
    from tests.test_cli import invoke

    code, _, err = invoke(
        "run",
        "samples/quickstart.py",
        "-o",
        str(tmp_path / "run.json"),
        "--profile",
        str(tmp_path / "prof.json"),
    )
    assert code == 0, err
    merged = json.loads((tmp_path / "prof.json").read_text())
    trace = hooktrace.load(tmp_path / "run.json")
    pairs = _aligned_hooks(merged, trace)
    assert len(pairs) == len([e for e in trace.events if e.type == "hook"]) > 0
    for ours, theirs in pairs:
        assert _centred(ours, theirs), (ours["name"], ours["ts"], ours["dur"], theirs["ts"], theirs["dur"])
    assert any(e.get("name") == "aten::linear" for e in merged["traceEvents"])


_FIRST_PROFILE_INSIDE = """
import json, sys, warnings
import torch, hooktrace
from torch import nn
from hooktrace.render.merged import merge_profile

warnings.simplefilter("ignore")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
model[0].register_forward_hook(lambda module, args, out: out * 2)
model[2].register_forward_pre_hook(lambda module, args: (args[0] + 1,))
compiled = torch.compile(model, backend="eager")
x = torch.randn(3, 4)

def profiled():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as p:
        compiled(x)
    p.export_chrome_trace(sys.argv[1])
    return json.load(open(sys.argv[1]))

with hooktrace.trace(compiled) as t:
    compiled(x)  # the graph is compiled here, seen by the capture
    inside = profiled()  # the process's first with_stack profile
after = profiled()
json.dump({"inside": merge_profile(t.trace, inside), "after": after}, open(sys.argv[1], "w"))
"""


def test_first_with_stack_profile_inside_a_block_keeps_module_and_compiled_ranges(tmp_path: Path) -> None:
    """PyTorch reads `nn.Module.__call__`'s code once per process, when the first with_stack profile
    starts; started inside the block it read hooktrace's wrapper: the block's calls had two ranges
    (`nn.Module: OptimizedModule_0` and `module <root> (OptimizedModule)`) and no profile after the
    block had any `nn.Module:` range. Now: one range per call inside (named as the trace names it),
    PyTorch's after, and the merged file's compiled-graph span inside Dynamo's compiled region and
    the module's range."""
    import subprocess
    import sys

    script = tmp_path / "first_profile.py"
    script.write_text(_FIRST_PROFILE_INSIDE)
    out = tmp_path / "profiles.json"
    subprocess.run([sys.executable, str(script), str(out)], check=True, capture_output=True, text=True)
    profiles = json.loads(out.read_text())
    inside, after = profiles["inside"], profiles["after"]
    modules = _module_ranges(inside, "module ")
    assert [m["name"] for m in modules] == ["module <root> (Sequential)"]
    assert not _module_ranges(inside, "nn.Module: ")
    assert [m["name"] for m in _module_ranges(after, "nn.Module: ")] == ["nn.Module: OptimizedModule_0"]
    assert not _module_ranges(after, "module ")
    (region,) = _module_ranges(inside, "Torch-Compiled Region")
    assert _inside(modules[0], region)
    # the profiler's own range of the graph's run, naming its hooks
    (ranged,) = [
        e for e in _module_ranges(inside, "torch.compile graph 1") if e.get("cat") == "user_annotation"
    ]
    assert ranged["name"] == "torch.compile graph 1 (hooks in program order): <lambda>, <lambda>"
    assert _inside(region, ranged)
    graphs = [
        e
        for e in inside["traceEvents"]
        if e.get("ph") == "X" and e.get("args", {}).get("kind") == "compiled_graph"
    ]
    assert len(graphs) == 2  # the compiling call's run, before the profile, and the profiled call's
    assert all(
        g["name"].startswith("torch.compile graph 1") and g["name"].count("<lambda>") == 2 for g in graphs
    )
    slack = 50.0  # µs: hooktrace's events are placed by its clock anchor (no hook ran as Python to refine it)
    assert graphs[0]["ts"] + graphs[0]["dur"] < region["ts"]
    assert region["ts"] - slack <= graphs[1]["ts"]
    assert graphs[1]["ts"] + graphs[1]["dur"] <= region["ts"] + region["dur"] + slack


def test_a_compiled_autograd_graph_run_is_a_range_naming_its_hooks_in_the_order_they_ran() -> None:
    """Under compiled autograd the hooks run inside the backward graph, no shim range of their own: the
    graph's run is one range naming them in the order they ran (their own record). Untraced, the
    same profile has no such range (hooktrace's, not PyTorch's)."""
    compiled_autograd = pytest.importorskip("torch._dynamo.compiled_autograd")

    def ranges(traced: bool) -> tuple[list[list[str]], list[list[str]]]:
        torch._dynamo.reset()
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        log: list[str] = []

        def labelled(label: str) -> Any:
            def hook(*args: Any) -> None:
                log.append(label)

            hook.__name__ = hook.__qualname__ = label
            return hook

        m[0].weight.register_hook(labelled("grad_w0"))
        m[2].weight.register_post_accumulate_grad_hook(labelled("acc_w2"))
        m[2].register_full_backward_hook(labelled("backward_2"))
        m[0].register_full_backward_pre_hook(labelled("backward_pre_0"))
        x = torch.randn(3, 4, requires_grad=True)
        named, ran = [], []
        with hooktrace.trace(m) if traced else contextlib.nullcontext():
            for _ in range(2):
                out = m(x)
                del log[:]
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
                    with compiled_autograd._enable(torch.compile(backend="eager")):
                        out.sum().backward()
                names = [e.name for e in p.events() if e.name.startswith("compiled autograd graph ")]
                named.append([n.split(": ", 1)[1] for n in names])
                ran.append([", ".join(log)])
        torch._dynamo.reset()
        return named, ran

    named, ran = ranges(traced=True)
    assert named == ran and len(ran[0][0].split(", ")) == 4
    named, untraced = ranges(traced=False)
    assert named == [[], []] and untraced == ran  # the same hooks ran in the same order untraced
