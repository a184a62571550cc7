"""A hook that belongs to no module is never drawn inside some module's backward group (issue 21)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import hooktrace
from hooktrace.analysis import calltree


def _groups(node: Any, out: dict) -> dict:
    for child in node.children:
        if isinstance(child, calltree.Node):
            if child.kind == "group":
                out.setdefault(child.module, []).extend(
                    c.kind for c in child.children if not isinstance(c, calltree.Node)
                )
            _groups(child, out)
    return out


def test_a_node_hook_of_another_module_is_not_drawn_in_a_closed_backward_group():
    log: list[str] = []
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    m[1].register_full_backward_pre_hook(lambda mod, go: log.append("backward_pre"))
    m[1].register_full_backward_hook(lambda mod, gi, go: log.append("backward"))
    x = torch.randn(1, 2, requires_grad=True)
    with hooktrace.trace(m) as t:
        h = m[0](x)
        y = m[1](h)
        h.grad_fn.register_hook(lambda gi, go: log.append("node"))  # m[0]'s node: no module known
        m[1].weight.register_post_accumulate_grad_hook(lambda p: log.append("post_accumulate_grad"))
        y.sum().backward()
    trace = t.trace
    assert [e.kind for e in trace.hook_events()] == log  # the order the hooks recorded
    groups = _groups(calltree.build(trace).steps[0], {})
    assert "node" not in groups.get("1", [])  # it ran after module 1's backward hook closed its group
    # the nearest case: a hook of module 1 itself (its weight's) stays in module 1's group
    assert {"backward_pre", "backward"} <= set(groups["1"])
    assert "post_accumulate_grad" in groups["1"]
