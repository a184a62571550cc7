"""The tree of real traces from the capture engine: printed order is the order the hooks recorded."""

from __future__ import annotations

import re
from typing import Any

from hooktrace.schema import Trace
from tests.test_render_tree import hook_lines, lines_with, plain

# -- real traces from the capture engine -----------------------------------------------------------------


def _real_capture() -> Any:
    import torch  # a dependency: the capture is always there

    return torch


def traced_block(steps: int = 1) -> tuple[Trace, list[str]]:
    """Block(fc1, act, fc2) with a global pre-hook, a prepended pre-hook and backward hooks; the hooks
    record the order they really ran in."""
    torch = _real_capture()
    import hooktrace

    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(4, 4)
            self.act = nn.ReLU()
            self.fc2 = nn.Linear(4, 2)

        def forward(self, x: Any) -> Any:
            return self.fc2(self.act(self.fc1(x)))

    fired: list[str] = []

    def recorder(name: str) -> Any:
        def hook(*args: Any) -> None:
            fired.append(name)

        hook.__qualname__ = name
        return hook

    torch.manual_seed(0)
    model = Block()
    x = torch.randn(3, 4, requires_grad=True)
    with hooktrace.trace(model) as t:
        handle = nn.modules.module.register_module_forward_pre_hook(recorder("global_pre"))
        try:
            model.fc1.register_forward_pre_hook(recorder("fc1_late"))
            model.fc1.register_forward_pre_hook(recorder("fc1_early"), prepend=True)
            model.fc2.register_forward_hook(recorder("fc2_after"))
            model.fc2.register_full_backward_pre_hook(recorder("fc2_bpre"))
            model.fc1.register_full_backward_hook(recorder("fc1_bpost"))
            model.fc1.weight.register_hook(recorder("fc1_weight_grad"))
            for step in range(steps):
                if step:
                    t.mark_step()
                model(x).sum().backward()
        finally:
            handle.remove()
    return t.trace, fired


def mask_sites(text: str) -> str:
    return re.sub(r"\S+\.py:\d+", "<file>:<line>", text)


def test_real_trace_lists_hooks_in_the_order_they_fired(golden: Any) -> None:
    trace, fired = traced_block()
    text = plain(trace)
    assert [name for _, _, name in hook_lines(text)] == fired
    seqs = [s for s, _, _ in hook_lines(text)]
    assert seqs == sorted(seqs)
    (early,) = lines_with(text, "forward_pre   fc1_early")
    assert "[prepend]" in early
    assert all("[global]" in line for line in lines_with(text, "forward_pre   global_pre"))
    assert "global-first" in text  # prepend does not beat the global hook
    trace.surprises = []  # their wording belongs to the analysis, not to this renderer
    golden("tree/real_block.txt", mask_sites(plain(trace)))


def test_real_trace_with_steps_collapses_them() -> None:
    trace, fired = traced_block(steps=3)
    text = plain(trace)
    assert "step 0" in text and "×2 more steps with the same order (step 1 … step 2)" in text
    # step -> phase: each step's forward hooks then its backward hooks, as they fired
    names = [name for _, _, name in hook_lines(plain(trace, expand=True))]
    assert names == fired
    assert len(names) == 30


def test_real_checkpoint_shows_recompute() -> None:
    torch = _real_capture()
    from torch.utils.checkpoint import checkpoint

    import hooktrace

    nn = torch.nn
    inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    outer = nn.Linear(4, 1)
    model = nn.Sequential(inner, outer)
    fired: list[str] = []
    x = torch.randn(2, 4, requires_grad=True)
    with hooktrace.trace(model) as t:
        inner[0].register_forward_pre_hook(lambda m, a: fired.append("pre"))
        y = checkpoint(inner, x, use_reentrant=False)
        outer(y).sum().backward()
    text = plain(t.trace)
    assert fired == ["pre", "pre"]
    recompute = text[text.index("recompute (forward again during backward)") :]
    assert len(lines_with(recompute, "forward_pre")) == 1
    assert len(lines_with(text[: text.index("recompute (")], "forward_pre")) == 1


def pre(module: Any, args: Any) -> None: ...


def post(module: Any, args: Any, output: Any) -> None: ...


def bpre(module: Any, grad_output: Any) -> None: ...


def bpost(module: Any, grad_input: Any, grad_output: Any) -> None: ...


def test_real_transformer_encoder_reads_in_about_two_screens() -> None:
    torch = _real_capture()
    import hooktrace

    nn = torch.nn
    layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=12, enable_nested_tensor=False)
    with hooktrace.trace(model) as t:
        for _, m in model.named_modules():
            m.register_forward_pre_hook(pre)
            m.register_forward_hook(post)
            m.register_full_backward_pre_hook(bpre)
            m.register_full_backward_hook(bpost)
        model(torch.randn(2, 3, 8, requires_grad=True)).sum().backward()
    text = plain(t.trace)
    assert len(text.splitlines()) <= 120
    assert "×11 more with the same order (layers.1 … layers.11" in text
    assert "×11 more with the same order (layers.10 … layers.0" in text
    expanded = plain(t.trace, expand=True)
    events = [e.seq for e in t.trace.events if e.type == "hook"]
    assert [s for s, _, _ in hook_lines(expanded)] == events  # no recompute: printed order is event order
