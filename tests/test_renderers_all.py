"""Every registered renderer over a set of traces: hand-built ones (here, also used by the DOT,
Chrome and diff tests) and real traces of tiny models.

Each rendering must be deterministic, survive save/load unchanged and name every hook it draws.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from hooktrace.render import RENDERERS, RenderError, format_for_path, render, renderer
from hooktrace.schema import Event, Hook, Meta, Module, Surprise, Trace
from hooktrace.validate import from_dict, load

HAS_DOT = shutil.which("dot") is not None


class Builder:
    """Hand-built traces: seq in call order, times 1 µs apart, fixed thread ids, no file paths."""

    def __init__(self, *modules: tuple[str, str]) -> None:
        self.modules = [Module(p, t) for p, t in (("", "Net"),) + modules]
        self.hooks: list[Hook] = []
        self.events: list[Event] = []
        self.surprises: list[Surprise] = []
        self.step = 0
        self.open: list[int] = []
        self.lines: dict[str, int] = {}

    def hook(self, kind: str, module: Optional[str], name: str, scope: str = "module", **flags: Any) -> int:
        hid = 100 + len(self.hooks)
        line = self.lines.setdefault(name, 10 + len(self.lines))  # same function, same line
        self.hooks.append(
            Hook(hid, kind, scope, module=module, name=name, defined_at=f"model.py:{line}", **flags)
        )
        return hid

    def event(self, type_: str, module: Optional[str], phase: str = "forward", hook: Optional[int] = None,
              returned: bool = False, error: Optional[str] = None, thread: int = 7) -> int:  # fmt: skip
        seq = len(self.events)
        kind = next(h.kind for h in self.hooks if h.id == hook) if hook is not None else None
        dur = 400 if type_ == "hook" else 0
        self.events.append(
            Event(
                seq,
                self.step,
                type_,
                phase,
                module,
                hook,
                kind,
                thread,
                1000 * (seq + 1),
                dur,
                returned,
                error,
            )
        )
        return seq

    def fire(self, hook: int, module: Optional[str], phase: str = "forward", **kw: Any) -> int:
        return self.event("hook", module, phase, hook, **kw)

    def enter(self, module: str, phase: str = "forward", thread: int = 7) -> None:
        self.open.append(self.event("enter", module, phase, thread=thread))

    def exit(self, module: str, phase: str = "forward", error: Optional[str] = None, thread: int = 7) -> None:
        seq = self.event("exit", module, phase, error=error, thread=thread)
        start = self.events[self.open.pop()]
        self.events[start.seq] = start._replace(duration_ns=self.events[seq].start_ns - start.start_ns)

    def trace(self, target: str = "model.py:make") -> Trace:
        meta = Meta(torch="2.13.0", python="3.11.9", device="cpu", target=target, steps=self.step + 1,
                    created="2026-01-01T00:00:00+00:00")  # fmt: skip
        return Trace(meta, self.modules, self.hooks, self.events, self.surprises)


def two_layer() -> Trace:
    """Net(fc1, act, fc2): global and prepended pre-hooks, kwargs/always_call; backward and a grad hook."""
    b = Builder(("fc1", "Linear"), ("act", "ReLU"), ("fc2", "Linear"))
    g = b.hook("forward_pre", None, "global_pre", scope="global")
    pre = b.hook("forward_pre", "fc1", "cast_inputs")
    early = b.hook("forward_pre", "fc1", "early", prepend=True, prepend_source="registration")
    f1 = b.hook("forward", "fc1", "after_fc1", with_kwargs=True, always_call=True)
    f2 = b.hook(
        "forward",
        "fc2",
        "Recorder.after",
    )
    bp = b.hook("backward_pre", "fc2", "grad_out_fc2")
    bw = b.hook("backward", "fc1", "grad_fc1")
    gw = b.hook("grad", "fc1", "weight_grad", scope="tensor", tensor="fc1.weight")
    b.enter("")
    b.fire(g, "")
    b.enter("fc1")
    b.fire(g, "fc1")
    b.fire(early, "fc1")
    b.fire(pre, "fc1", returned=True)
    b.fire(f1, "fc1")
    b.exit("fc1")
    b.enter("act")
    b.fire(g, "act")
    b.exit("act")
    b.enter("fc2")
    b.fire(g, "fc2")
    b.fire(f2, "fc2")
    b.exit("fc2")
    b.exit("")
    b.fire(bp, "fc2", "backward")
    b.fire(gw, "fc1", "backward")
    b.fire(bw, "fc1", "backward")
    b.surprises.append(
        Surprise("global-first", "early was prepended but global_pre ran first", [early, g], [3])
    )
    return b.trace()


def with_errors() -> Trace:
    """A hook raises inside fc; the always_call forward hook still runs; the call raises."""
    b = Builder(("fc", "Linear"))
    bad = b.hook("forward_pre", "fc", "check_shape")
    always = b.hook("forward", "fc", "cleanup", always_call=True)
    b.enter("")
    b.enter("fc")
    b.fire(bad, "fc", error="ValueError: bad shape (2, 3)")
    b.fire(always, "fc")
    b.exit("fc", error="ValueError: bad shape (2, 3)")
    b.exit("", error="ValueError: bad shape (2, 3)")
    b.surprises.append(
        Surprise("hook-error", "check_shape raised; cleanup (always_call) still ran", [bad], [2])
    )
    return b.trace()


def layers(
    n: int = 12, steps: int = 1, subs: tuple[str, ...] = ("self_attn", "linear1", "linear2", "norm1")
) -> Trace:
    """A TransformerEncoder-like stack: n identical layers, hooks on every module, backward nested."""
    mods: list[tuple[str, str]] = [("layers", "ModuleList")]
    for i in range(n):
        mods.append((f"layers.{i}", "EncoderLayer"))
        mods += [(f"layers.{i}.{s}", "Linear" if s.startswith("linear") else "Sub") for s in subs]
    b = Builder(*mods)
    gf = b.hook("forward", None, "global_forward", scope="global")
    kinds = ("forward_pre", "forward", "backward_pre", "backward")
    hooks = {
        (p, k): b.hook(k, p, f"{k}_hook") for p, _ in [("", "Net")] + mods if p != "layers" for k in kinds
    }
    for step in range(steps):
        b.step = step
        b.enter("")
        b.fire(hooks[("", "forward_pre")], "")
        for i in range(n):
            lp = f"layers.{i}"
            b.enter(lp)
            b.fire(hooks[(lp, "forward_pre")], lp)
            for s in subs:
                sp = f"{lp}.{s}"
                b.enter(sp)
                b.fire(hooks[(sp, "forward_pre")], sp)
                b.fire(gf, sp)
                b.fire(hooks[(sp, "forward")], sp)
                b.exit(sp)
            b.fire(gf, lp)
            b.fire(hooks[(lp, "forward")], lp)
            b.exit(lp)
        b.fire(gf, "")
        b.fire(hooks[("", "forward")], "")
        b.exit("")
        b.fire(hooks[("", "backward_pre")], "", "backward")
        for i in reversed(range(n)):
            lp = f"layers.{i}"
            b.fire(hooks[(lp, "backward_pre")], lp, "backward")
            for s in reversed(subs):
                sp = f"{lp}.{s}"
                b.fire(hooks[(sp, "backward_pre")], sp, "backward")
                b.fire(hooks[(sp, "backward")], sp, "backward")
            b.fire(hooks[(lp, "backward")], lp, "backward")
        b.fire(hooks[("", "backward")], "", "backward")
    return b.trace("transformer.py:make")


def recompute_two_steps() -> Trace:
    """Two steps: step 0 lazily registers a hook; backward recomputes a checkpointed block on thread 8."""
    b = Builder(("block", "Block"), ("block.fc", "Linear"))
    pre = b.hook("forward_pre", "block", "lazy_init", prepend=True, prepend_source="inferred")
    fwd = b.hook("forward", "block.fc", "save_act")
    grad = b.hook("post_accumulate_grad", "block.fc", "reduce_grad", scope="tensor", tensor="block.fc.weight")
    late = b.hook("forward_pre", "block", "registered_late", registered_during_run=True)
    for step in range(2):
        b.step = step
        b.enter("")
        b.enter("block")
        b.fire(pre, "block")
        if step == 1:
            b.fire(late, "block")
        b.enter("block.fc")
        b.fire(fwd, "block.fc")
        b.exit("block.fc")
        b.exit("block")
        b.exit("")
        b.enter("block", "recompute", thread=8)
        b.fire(pre, "block", "recompute", thread=8)
        b.enter("block.fc", "recompute", thread=8)
        b.fire(fwd, "block.fc", "recompute", thread=8)
        b.exit("block.fc", "recompute", error="CheckpointError: stop recompute early", thread=8)
        b.exit("block", "recompute", thread=8)
        b.fire(grad, "block.fc", "backward", thread=8)
        b.fire(grad, "block.fc", "backward", thread=8)
    b.surprises.append(Surprise("recompute", "forward hooks fired again during backward", [fwd], [12]))
    return b.trace()


def training_step() -> Trace:
    """Version 2 kinds (docs/format.md): a forward wrapper, saved-tensor pack/unpack, an AccumulateGrad node hook and a
    post-accumulate-grad hook on fc.weight, optimizer step hooks (per optimizer and global)."""
    b = Builder(("fc", "Linear"))
    wrap = b.hook("forward_wrapper", "fc", "offload_forward")
    pack = b.hook("pack", None, "pack_to_cpu", scope="saved_tensors")
    unpack = b.hook("unpack", None, "unpack_from_cpu", scope="saved_tensors")
    node = b.hook("node", "fc", "AccumulateGrad_hook", scope="node", tensor="fc.weight")
    acc = b.hook("post_accumulate_grad", "fc", "step_in_backward", scope="tensor", tensor="fc.weight")
    opt_pre = b.hook("optimizer_step_pre", None, "before_step", scope="optimizer")
    opt_post = b.hook("optimizer_step_post", None, "global_after_step", scope="global")
    b.enter("")
    b.enter("fc")
    b.fire(wrap, "fc")
    b.fire(pack, "fc")
    b.fire(pack, "fc")
    b.exit("fc")
    b.exit("")
    b.fire(unpack, None, "backward")
    b.fire(unpack, None, "backward")
    b.fire(acc, None, "backward")
    b.fire(node, None, "backward")
    b.fire(opt_pre, None, "optimizer")
    b.fire(opt_post, None, "optimizer")
    return b.trace()


def empty() -> Trace:
    return Builder().trace()


SAMPLES: dict[str, Callable[[], Trace]] = {
    "two_layer": two_layer,
    "with_errors": with_errors,
    "layers": lambda: layers(3),
    "recompute_two_steps": recompute_two_steps,
    "training_step": training_step,
    "empty": empty,
}


@functools.cache
def _tiny_real_traces() -> dict[str, Trace]:
    """Real traces of tiny models: prepend and global hooks, a checkpointed block, two steps."""
    import torch  # a dependency: the capture is always there
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.utils.checkpoint import checkpoint

    import hooktrace

    def seen(*_: Any) -> None:
        return None

    def first(*_: Any) -> None:
        return None

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(4, 4)
            self.block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
            self.fc2 = torch.nn.Linear(4, 1)

        def forward(self, x: Any) -> Any:
            x = self.fc1(x)
            x = checkpoint(self.block, x, use_reentrant=False)
            return self.fc2(x)

    torch.manual_seed(0)
    out: dict[str, Trace] = {}
    handle = register_module_forward_pre_hook(seen)
    try:
        model = Net()
        model.fc1.register_forward_pre_hook(seen)
        model.fc1.register_forward_pre_hook(first, prepend=True)
        model.block.register_forward_hook(seen)
        model.fc2.register_full_backward_hook(seen)
        model.fc1.weight.register_hook(lambda g: None)
        with hooktrace.trace(model) as t:
            for _ in range(2):
                model(torch.randn(2, 4)).sum().backward()
                t.mark_step()
        out["real_checkpoint_two_steps"] = t.trace
    finally:
        handle.remove()
    return out


def _all_traces() -> list[tuple[str, Trace]]:
    return [(name, make()) for name, make in SAMPLES.items()]


def _check_rendering(fmt: str, trace: Trace, tmp_path: Path) -> None:
    r = renderer(fmt)
    if fmt == "svg" and not HAS_DOT:
        pytest.skip("Graphviz dot is not installed")
    out = render(trace, fmt)
    assert isinstance(out, bytes if r.binary else str)
    text = out.decode("utf-8") if isinstance(out, bytes) else out
    assert text.strip()
    assert render(trace, fmt) == out, "renderers keep no state between calls"
    path = tmp_path / "trace.json"
    trace.save(path)
    assert render(load(path), fmt) == out, "a saved and loaded trace renders the same"
    fired = {e.hook for e in trace.events if e.type == "hook"}
    hooks = [h for h in trace.hooks if h.id in fired]
    for h in hooks:
        name = h.name.replace("<", "&lt;").replace(">", "&gt;") if fmt == "svg" else h.name
        if fmt == "html":  # inside the page's JSON, where < > & are \u escapes
            name = h.name.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
        assert name in text, f"{fmt} does not name hook {h.name!r}"
    if any(h.prepend for h in hooks):
        assert "prepend" in text
    if any(h.scope == "global" for h in hooks):
        assert "global" in text
    if fmt in ("json", "chrome"):
        json.loads(text)


@pytest.mark.parametrize("fmt", list(RENDERERS))
@pytest.mark.parametrize("sample", list(SAMPLES))
def test_every_renderer_on_hand_built_traces(fmt: str, sample: str, tmp_path: Path) -> None:
    _check_rendering(fmt, SAMPLES[sample](), tmp_path)


@pytest.mark.parametrize("fmt", list(RENDERERS))
def test_every_renderer_on_real_traces(fmt: str, tmp_path: Path) -> None:
    for _name, trace in _tiny_real_traces().items():
        assert any(e.type == "hook" for e in trace.events)
        _check_rendering(fmt, trace, tmp_path)


def test_registry_metadata() -> None:
    assert list(RENDERERS) == ["tree", "json", "dot", "svg", "chrome", "order", "html"]
    for name, r in RENDERERS.items():
        assert r.name == name and r.extension.startswith(".") and isinstance(r.binary, bool) and r.description
        assert callable(r.function())


def test_json_renderer_is_the_trace_format(tmp_path: Path) -> None:
    trace = two_layer()
    text = render(trace, "json")
    assert isinstance(text, str)
    assert from_dict(json.loads(text)).to_dict() == trace.to_dict()
    trace.save(tmp_path / "t.json")
    assert (tmp_path / "t.json").read_text(encoding="utf-8") == text


@pytest.mark.parametrize(
    ("path", "fmt", "expected"),
    [
        (None, None, "tree"),
        ("out.json", None, "json"),
        ("out.JSON.gz", None, "json"),
        ("X.JSON.GZ", None, "json"),
        ("trace.svg.gz", None, "svg"),  # written gzip-compressed, as every name ending in .gz
        ("out.txt.gz", None, "order"),
        ("out.dot", None, "dot"),
        ("dir.v2/OUT.SVG", None, "svg"),
        ("out.json", "chrome", "chrome"),
        ("out.txt", "tree", "tree"),
        ("out.txt", None, "order"),
        ("OUT.TXT", None, "order"),
        (None, "dot", "dot"),
    ],
)
def test_format_for_path(path: Optional[str], fmt: Optional[str], expected: str) -> None:
    assert format_for_path(path, fmt) == expected


@pytest.mark.parametrize("path", ["out.text", "out", "out.trace", "trace.png.gz", "trace.gz"])
def test_format_for_path_needs_format_for_other_extensions(path: str) -> None:
    with pytest.raises(RenderError, match="--format"):
        format_for_path(path, None)


def test_unknown_format_and_option_are_render_errors() -> None:
    with pytest.raises(RenderError, match="unknown format 'png'.*tree, json, dot, svg, chrome"):
        format_for_path("x.png", "png")
    with pytest.raises(RenderError, match="unknown format"):
        render(two_layer(), "pdf")
    with pytest.raises(RenderError, match="chrome renderer has no option expand"):
        render(two_layer(), "chrome", expand=True)


def test_svg_without_dot_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` on it
    with pytest.raises(RenderError) as info:
        render(two_layer(), "svg")
    message = str(info.value)
    assert "apt-get install graphviz" in message and "brew install graphviz" in message and "conda" in message
    assert "digraph" in render(two_layer(), "dot")  # DOT needs no program


def test_rendering_imports_no_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from hooktrace.render import RENDERERS, render\n"
        "from hooktrace.analysis.diff import diff_traces\n"
        "from hooktrace.schema import Trace\n"
        "t = Trace()\n"
        "for name in RENDERERS:\n"
        "    if name != 'svg':\n"
        "        render(t, name)\n"
        "diff_traces(t, t)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("sample", list(SAMPLES))
def test_notebook_html_on_every_trace(sample: str) -> None:
    import html

    from hooktrace.render.notebook import trace_html

    trace = SAMPLES[sample]()
    out = trace_html(trace)
    assert out == trace_html(trace) and "<pre" in out and "\x1b" not in out
    for h in trace.hooks:
        if any(e.hook == h.id for e in trace.events):
            assert html.escape(h.name, quote=False) in out
