"""The call tree every renderer draws (`analysis.calltree`), and the tree and DOT drawing the same
nesting from it: a module called twice, whose backward hooks therefore fire twice, is two groups in
both; pack/unpack summarised per call; hooks of no module; duplicate seqs."""

from __future__ import annotations

import re
from typing import Any, Optional

import pytest

from hooktrace.analysis import calltree as ct
from hooktrace.render.dot import dot_source
from hooktrace.render.tree import tree_text
from hooktrace.schema import Trace
from tests.test_renderers_all import SAMPLES, Builder, layers

PHASE_WORDS = ("forward", "backward", "recompute", "optimizer", "other")


def shared_layer_twice() -> Trace:
    """`shared` is called twice in forward, so its full backward hooks fire twice in backward."""
    b = Builder(("shared", "Linear"), ("head", "Linear"))
    pre = b.hook("forward_pre", "shared", "pre")
    bpre = b.hook("backward_pre", "shared", "bpre")
    bpost = b.hook("backward", "shared", "bpost")
    hpost = b.hook("backward", "head", "head_bpost")
    b.enter("")
    for _ in range(2):
        b.enter("shared")
        b.fire(pre, "shared")
        b.exit("shared")
    b.enter("head")
    b.exit("head")
    b.exit("")
    b.fire(hpost, "head", "backward")
    for _ in range(2):
        b.fire(bpre, "shared", "backward")
        b.fire(bpost, "shared", "backward")
    return b.trace()


def tree_nesting(text: str) -> list[tuple[int, str]]:
    """(column, module) of every module call or group line in a plain tree."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^([│ ]*[├└]── )(\S+) (\w+)(  call #|$)", line)
        if m and m.group(2) not in PHASE_WORDS and not m.group(2).startswith(("#", "×", "…", "step")):
            out.append((len(m.group(1)) // 4, m.group(2)))
    return out


def dot_nesting(dot: str) -> list[tuple[int, str]]:
    """(depth, module) of every module cluster in DOT source, in order."""
    out = []
    lines = dot.splitlines()
    for i, line in enumerate(lines):
        if "subgraph cluster_" in line and "legend" not in line:
            label = re.search(r'label="?([^" ]*)', lines[i + 1])
            assert label is not None
            if label.group(1) not in PHASE_WORDS and label.group(1) != "step":
                out.append((len(line) - len(line.lstrip("\t")), label.group(1)))
    return out


def normalised(pairs: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Depths relative to the shallowest, so the tree's phase level and DOT's top level line up."""
    low = min((d for d, _ in pairs), default=0)
    return [(d - low, m) for d, m in pairs]


@pytest.mark.parametrize("expand", [False, True])
@pytest.mark.parametrize("name", ["shared_twice", "two_layer", "layers", "recompute_two_steps"])
def test_tree_and_dot_draw_the_same_nesting(name: str, expand: bool) -> None:
    trace = shared_layer_twice() if name == "shared_twice" else SAMPLES[name]()
    tree = tree_nesting(tree_text(trace, width=200, expand=expand, times=False))
    dot = dot_nesting(dot_source(trace, expand=expand))
    assert tree and normalised(tree) == normalised(dot)


def test_a_module_called_twice_is_two_backward_groups_in_both() -> None:
    trace = shared_layer_twice()
    tree = ct.build(trace, expand=True)
    (step,) = tree.steps
    backward = next(p for p in step.children if p.phase == "backward")  # type: ignore[union-attr]
    groups = [(c.kind, c.module) for c in backward.children]  # type: ignore[union-attr]
    assert groups == [("group", "head"), ("group", "shared"), ("group", "shared")]
    text = tree_text(trace, width=120, times=False, expand=True)
    backward_text = text[text.index("backward ") :]
    assert backward_text.count("shared Linear") == 2
    dot = dot_source(trace, expand=True)
    assert dot.split("label=backward")[1].count('"shared (Linear)"') == 2
    # collapsed: one group drawn, one "×1 more", in both
    assert "×1 more with the same order (shared" in tree_text(trace, width=120, times=False)
    assert "×1 more with the same hook order\\nshared" in dot_source(trace)


def saved_tensors_trace(n: int = 40) -> Trace:
    b = Builder(("fc", "Linear"))
    pack = b.hook("pack", None, "pack_to_cpu", scope="saved_tensors")
    unpack = b.hook("unpack", None, "unpack_from_cpu", scope="saved_tensors")
    post = b.hook("forward", "fc", "after")
    b.enter("")
    b.enter("fc")
    for _ in range(n):
        b.fire(pack, "fc")
    b.fire(post, "fc")
    b.exit("fc")
    b.exit("")
    for _ in range(n):
        b.fire(unpack, None, "backward")
    return b.trace()


def test_pack_unpack_are_one_line_per_call_unless_expanded() -> None:
    trace = saved_tensors_trace()
    text = tree_text(trace, width=100, times=False)
    (line,) = [x for x in text.splitlines() if "saved tensors" in x and " pack" in x]
    assert "#2–#41" in line and "40 pack" in line and "pack_to_cpu" in line
    assert text.index("saved tensors") > text.index("fc Linear") and text.index("saved tensors") < text.index(
        "after"
    )
    assert "40 unpack" in text and "unpack_from_cpu" in text
    assert len(text.splitlines()) < 15
    expanded = tree_text(trace, width=100, times=False, expand=True)
    assert expanded.count("pack_to_cpu") == 40 and "saved tensors" not in expanded
    dot = dot_source(trace)
    assert "40 pack" in dot and "40 unpack" in dot and "saved-tensor pack/unpack" in dot


def test_hooks_of_no_module_go_into_what_is_open() -> None:
    b = Builder(("fc", "Linear"))
    opt = b.hook("optimizer_step_pre", None, "before_step", scope="optimizer")
    post = b.hook("forward", "fc", "after")
    b.enter("fc")
    b.fire(post, "fc")
    b.exit("fc")
    b.fire(opt, None, "optimizer")
    tree = ct.build(b.trace())
    phases = [p for p in tree.steps[0].children]
    assert [p.phase for p in phases] == ["forward", "optimizer"]  # type: ignore[union-attr]
    assert [type(c).__name__ for c in phases[1].children] == ["Event"]  # type: ignore[union-attr]
    text = tree_text(b.trace(), width=100, times=False)
    assert "optimizer (optimizer.step)" in text and "before_step" in text


def test_steps_hold_their_phases_in_order() -> None:
    tree = ct.build(layers(2, steps=3))
    assert [s.step for s in tree.steps] == [0, 1, 2]
    for s in tree.steps:
        assert [p.phase for p in s.children] == ["forward", "backward"]  # type: ignore[union-attr]
    assert len({s.sig for s in tree.steps}) == 1
    assert [len(same) for _, same in ct.runs(tree.steps)] == [2]
    assert [len(same) for _, same in ct.runs(tree.steps, expand=True)] == [0, 0, 0]


def test_duplicate_seqs_are_drawn_without_duplicate_ids() -> None:
    trace = SAMPLES["two_layer"]()
    trace.events = [e._replace(seq=min(e.seq, 5)) for e in trace.events]
    dot = dot_source(trace)
    ids = re.findall(r"^\s*(\w+) \[", dot, flags=re.M)
    assert len(ids) == len(set(ids))
    text = tree_text(trace, width=100)
    assert "early" in text


def relative_cases() -> list[tuple[Optional[str], Optional[str], Any]]:
    return [("layers.0.fc", "layers.0", "fc"), ("layers.0", "layers.0", ""), ("a", "", "a"), ("x.y", "z", "x.y"),
            (None, "a", None)]  # fmt: skip


@pytest.mark.parametrize(("child", "parent", "expected"), relative_cases())
def test_relative_paths(child: Optional[str], parent: Optional[str], expected: Any) -> None:
    assert ct.relative(child, parent) == expected
    if child is not None and parent is not None and expected != child:
        assert ct.contains(parent, child)


def test_backward_groups_of_submodules_go_into_the_module_whose_backward_hook_follows() -> None:
    """Layers with a full backward hook (no pre-hook) and a hook on a submodule's parameter: the
    parameter's group fires first, then the layer's hook. The layer's group takes it in, so the
    layers are identical siblings and collapse (80 of them were 320 alternating lines). A group of
    a module that is not a descendant (the head) stays where it is; seq order is kept."""
    import torch
    from torch import nn

    import hooktrace

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            return self.fc(x).relu()

    model = nn.Sequential(*[Block() for _ in range(4)], nn.Linear(4, 2))
    for block in model[:4]:
        block.register_full_backward_hook(lambda m, gi, go: None)
        block.fc.weight.register_post_accumulate_grad_hook(lambda p: None)
    model[4].weight.register_post_accumulate_grad_hook(lambda p: None)
    with hooktrace.trace(model) as t:
        model(torch.ones(2, 4, requires_grad=True)).sum().backward()
    tree = ct.build(t.trace)
    backward = next(p for p in tree.steps[0].children if p.phase == "backward")
    assert [(c.kind, c.module) for c in backward.children] == [
        ("group", "4"), ("group", "3"), ("group", "2"), ("group", "1"), ("group", "0")
    ]  # fmt: skip
    assert [(c.module, c.kind) for c in backward.children[1].children] == [
        ("3.fc", "group"),
        ("3", "backward"),
    ]
    runs = list(ct.runs(backward.children))
    assert [(item.module, len(same)) for item, same in runs] == [("4", 0), ("3", 3)]

    def read(node: ct.Node) -> list[int]:  # top to bottom, as the tree is read
        return [s for c in node.children for s in (read(c) if isinstance(c, ct.Node) else [c.seq])]

    assert read(backward) == [e.seq for e in t.trace.events if e.type == "hook" and e.phase == "backward"]
    text = tree_text(t.trace, width=100)
    assert "×3 more with the same order (2 … 0," in text, text
