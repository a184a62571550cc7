"""Every sample runs through `hooktrace run … --format json -o …`; the traced order equals what the
sample's own hooks recorded; each shows the surprise its docstring promises; golden trees."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import hooktrace
from hooktrace.render.tree import tree_text
from hooktrace.schema import Trace

from .test_cli import ROOT, invoke, script

SAMPLE_NAMES = [
    "quickstart",
    "prepend_displaced",
    "backward_order",
    "checkpoint_recompute",
    "quantization",
    "always_call",
    "transformer",
    "training_step",
    "saved_tensors",
    "forward_wrapper",
]


@pytest.fixture(autouse=True)
def at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # paths in the trace are relative to the working directory


def run_sample(name: str, tmp_path: Path, *args: str, expect: int = 0) -> tuple[Trace, list[str]]:
    out = tmp_path / f"{name}.json"
    code, _, err = invoke("run", f"samples/{name}.py", "--format", "json", "-o", str(out), *args)
    assert code == expect, err
    return hooktrace.load(out), list(sys.modules[name].CALLS)


def fired(trace: Trace, phase: str | None = None) -> list[str]:
    return [trace.hook(e.hook).name for e in trace.hook_events() if phase is None or e.phase == phase]


def rules(trace: Trace) -> set[str]:
    return {s.rule for s in trace.surprises}


_TORCH_LINE = re.compile(r"^(torch/.*\.py):\d+$")


def golden_tree(trace: Trace) -> str:
    """The tree compared with the golden files: line numbers inside torch's own files become `N`
    (they change with every torch patch release); the user's own `file:line`s stay as they are.
    Done on the trace, before rendering, so the layout does not depend on the numbers' width."""
    for h in trace.hooks:
        for name in ("defined_at", "registered_at", "registered_by"):
            value = getattr(h, name)
            if value and _TORCH_LINE.match(value):
                setattr(h, name, _TORCH_LINE.sub(r"\1:N", value))
    return tree_text(trace, width=100, color=False, times=False)


def test_golden_tree_keeps_user_lines_and_drops_torch_lines() -> None:
    from hooktrace.schema import Hook

    trace = Trace(hooks=[Hook(1, "forward", "module", defined_at="torch/distributed/fsdp/x.py:289"),
                         Hook(2, "forward", "module", defined_at="samples/quickstart.py:33")])  # fmt: skip
    golden_tree(trace)
    assert [h.defined_at for h in trace.hooks] == [
        "torch/distributed/fsdp/x.py:N",
        "samples/quickstart.py:33",
    ]


def test_quickstart(tmp_path: Path) -> None:
    trace, calls = run_sample("quickstart", tmp_path)
    assert fired(trace) == [c.split(":")[0] for c in calls]
    assert fired(trace)[:3] == ["global_pre", "first_pre", "log_pre"]
    first_pre = next(h for h in trace.hooks if h.name == "first_pre")
    assert (first_pre.prepend, first_pre.prepend_source) == (True, "registration")
    assert next(h for h in trace.hooks if h.name == "global_pre").scope == "global"
    assert "global-first" in rules(trace)


def test_prepend_displaced(tmp_path: Path) -> None:
    trace, calls = run_sample("prepend_displaced", tmp_path)
    assert fired(trace) == [c.split(":")[0] for c in calls] == ["log_inputs", "cast_inputs", "user_pre"]
    assert calls[0] == "log_inputs:torch.float64"  # it saw the inputs before the cast
    cast = next(h for h in trace.hooks if h.name == "cast_inputs")
    displaced = [s for s in trace.surprises if s.rule == "prepend-displaced"]
    assert displaced and cast.id in displaced[0].hooks


def test_backward_order(tmp_path: Path) -> None:
    trace, calls = run_sample("backward_order", tmp_path)
    assert fired(trace) == calls
    backward = fired(trace, "backward")
    assert backward.index("model_output_grad") < backward.index("before_backward")
    assert backward.index("before_backward") < backward.index("layer_output_grad")
    assert backward[-1] == "after_backward"
    assert "output-hook-before-backward-pre" in rules(trace)
    grads = {h.name: h for h in trace.hooks if h.kind == "grad"}
    assert (
        grads["layer_output_grad"].registered_during_run and grads["model_output_grad"].registered_during_run
    )


def test_checkpoint_recompute(tmp_path: Path) -> None:
    trace, calls = run_sample("checkpoint_recompute", tmp_path)
    names = {h.id: h.name for h in trace.hooks}
    own = [e for e in trace.hook_events() if e.kind not in ("pack", "unpack")]  # not checkpoint's own
    traced = [f"{names[e.hook].split('.')[-1]}:{e.module}" for e in own]
    assert traced == calls
    recompute = [e for e in own if e.phase == "recompute"]
    assert recompute and {e.module for e in recompute} <= {
        "blocks.0.fc",
        "blocks.0.act",
        "blocks.1.fc",
        "blocks.1.act",
    }
    assert "recompute" in rules(trace)
    assert "hook-error" not in rules(trace)  # the early stop is PyTorch's own, not an error


def test_quantization_observers_are_prepended(tmp_path: Path) -> None:
    trace, calls = run_sample("quantization", tmp_path, "--no-backward")
    observers = [h for h in trace.hooks if h.name == "_observer_forward_hook"]
    assert {h.module for h in observers} == {"quant", "conv", "fc"}
    for h in observers:
        assert (h.prepend, h.prepend_source) == (True, "registration")
        assert h.registered_at.startswith("torch/ao/quantization/")
    assert [f"inspect_output:{m}" for m in ("Conv2d", "Linear")] == calls
    for module in ("conv", "fc"):
        order = [trace.hook(e.hook).name for e in trace.hook_events() if e.module == module]
        assert order == ["_observer_forward_hook", "inspect_output"]


def test_always_call_exits_1_with_partial_trace(tmp_path: Path) -> None:
    trace, calls = run_sample("always_call", tmp_path, expect=1)
    assert fired(trace) == calls == ["before", "release_resources"]
    exits = [e for e in trace.events if e.type == "exit"]
    assert [(e.module, e.error) for e in exits][0] == ("encoder", None)
    exits = exits[1:]
    assert [e.module for e in exits] == ["flaky", ""]
    assert all(e.error == "RuntimeError: flaky layer failed on purpose" for e in exits)
    assert "never-fired" in rules(trace)


def test_transformer(tmp_path: Path) -> None:
    trace, calls = run_sample("transformer", tmp_path)
    kinds = {"forward_pre": "pre", "forward": "post"}
    assert [f"{kinds[e.kind]}:{e.module}" for e in trace.hook_events()] == calls
    layers = {
        e.module.split(".")[2] for e in trace.hook_events() if (e.module or "").startswith("encoder.layers.")
    }
    assert layers == {str(i) for i in range(12)}


def test_fsdp_checkpoint_on_a_real_one_rank_gloo_group(tmp_path: Path, golden) -> None:  # noqa: ANN001
    out = tmp_path / "fsdp.json"
    proc = script("run", "samples/fsdp_checkpoint.py", "--steps", "2", "--format", "json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    trace = hooktrace.load(out)
    assert trace.meta.steps == 2 and {e.step for e in trace.events} == {0, 1}
    pre_forward = [h for h in trace.hooks if h.name == "FSDPState._pre_forward"]
    assert pre_forward and all(h.prepend_source == "registration" for h in pre_forward)
    assert all(h.registered_at.startswith("torch/distributed/fsdp/") for h in pre_forward)
    assert all((h.registered_by or "").startswith("samples/fsdp_checkpoint.py:") for h in pre_forward)
    ckpt = [h for h in trace.hooks if h.name == "checkpoint.<locals>.forward_hook"]
    assert ckpt and all(h.prepend for h in ckpt)
    for step in (0, 1):
        for phase in ("forward", "recompute"):
            order = [
                trace.hook(e.hook).name
                for e in trace.hook_events()
                if e.step == step and e.phase == phase and e.module == "blocks.0" and e.kind == "forward_pre"
            ]
            assert order == ["FSDPState._pre_forward", "log_pre", "checkpoint.<locals>.forward_pre_hook"]
    assert "recompute" in rules(trace)
    golden("samples/fsdp_checkpoint.txt", golden_tree(trace))


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_golden_tree(name: str, tmp_path: Path, golden) -> None:  # noqa: ANN001
    trace, _ = run_sample(
        name,
        tmp_path,
        *(["--no-backward"] if name == "quantization" else []),
        expect=int(name == "always_call"),
    )
    golden(f"samples/{name}.txt", golden_tree(trace))


def test_training_step_renderings_on_a_real_run(tmp_path: Path) -> None:
    """Real capture of the v2 kinds: the optimizer phase in every step, node hooks under the module
    of the parameter they accumulate, and DOT/Chrome showing the same."""
    from hooktrace.render import render

    trace, _ = run_sample("training_step", tmp_path, "--steps", "2")
    text = tree_text(trace, width=100, times=False, expand=True)
    steps = text.split("── step ")[1:]
    assert len(steps) == 2
    for step in steps:
        assert step.index("backward ") < step.index("optimizer (optimizer.step)")
        optimizer = step[step.index("optimizer (optimizer.step)") :]
        assert "optimizer_step_pre" in optimizer and "optimizer_step_post" in optimizer
        body = step[step.index("body Linear") :]
        assert "node" in body.splitlines()[1] and "on body.weight" in body.splitlines()[1]
    dot = render(trace, "dot")
    assert isinstance(dot, str) and "label=optimizer" in dot and "on body.weight" in dot
    chrome = json.loads(render(trace, "chrome"))
    cats = {
        e["cat"] for e in chrome["traceEvents"] if e.get("args", {}).get("kind", "").startswith("optimizer")
    }
    assert cats == {"optimizer"}


def test_saved_tensor_hooks_on_a_real_run_are_counted_per_call(tmp_path: Path) -> None:
    trace, _ = run_sample("saved_tensors", tmp_path)
    packs = [e for e in trace.hook_events() if e.kind == "pack"]
    text = tree_text(trace, width=100, times=False)
    counted = sum(int(n) for n in re.findall(r"saved tensors (\d+) pack", text))
    single = len(re.findall(r"#\d+ pack ", text))
    assert packs and counted + single == sum(
        1 for e in packs if e.phase == "forward" or e.phase == "recompute"
    )
    expanded = tree_text(trace, width=100, times=False, expand=True)
    assert "saved tensors" not in expanded and len(re.findall(r"#\d+ pack ", expanded)) == len(packs)
