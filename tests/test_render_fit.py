"""Issue 35, item 5: pictures that fit. A checkpointed stack of numbered layers folds in the recompute
phase as it does in forward (tree and DOT); the DOT heading is wrapped and top-left."""

from __future__ import annotations

import re

import torch
from torch.utils.checkpoint import checkpoint

import hooktrace
from hooktrace.render import render
from hooktrace.render.tree import tree_text

SEEN: list[str] = []


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(4)
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x))


class Stack(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer() for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False)  # the layer's own call is not re-run
        return x


def traced(n: int = 6) -> hooktrace.Trace:
    torch.manual_seed(0)
    model = Stack(n)
    for name, m in model.named_modules():
        if name.endswith((".fc", ".norm")):
            m.register_forward_hook(lambda mod, a, out, name=name: SEEN.append(name))
    SEEN.clear()
    with hooktrace.trace(model) as t:
        model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    return t.trace


def test_the_recompute_of_numbered_layers_folds_as_the_forward_does() -> None:
    trace = traced()
    user = [e for e in trace.events if e.type == "hook" and e.kind == "forward"]
    assert len(user) == len(SEEN) > 12  # the hooks' own record: forward, and again in the recompute
    text = tree_text(trace, width=200, times=False)
    recompute = text.split("recompute (forward again during backward)", 1)[1]
    assert "layers.5 Layer" in recompute  # the recompute's calls grouped under their layer
    assert "×5 more with the same order (layers.4 … layers.0" in recompute
    assert len(text.splitlines()) < 40, text
    whole = tree_text(trace, width=200, times=False, expand=True)  # --expand still lists every call
    assert all(f"layers.{i}.fc Linear" in whole.split("recompute", 1)[1] for i in range(6))


def test_the_dot_picture_folds_the_recompute_and_wraps_its_heading() -> None:
    dot = str(render(traced(), "dot"))
    assert dot.count("×5 more with the same hook order") == 2  # forward, and the recompute
    assert "labeljust=l" in dot
    title = re.search(r"<B>(.*?)</B>", dot, re.S)
    assert title is not None and all(len(line) <= 100 for line in re.split(r"<BR[^>]*>", title[1]))


def test_the_notebook_shows_the_report_once() -> None:
    from hooktrace.render.notebook import trace_html

    page = trace_html(traced(2))
    assert page.count("<iframe") == 1
    before_tree = page[: page.index("<pre")]
    assert before_tree.rstrip().endswith("<details><summary>the tree as text</summary>"), (
        "the text tree folded"
    )
