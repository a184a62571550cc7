"""`hooktrace hooks`: the listed order is the order PyTorch then fires the hooks (oracle)."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
from rich.console import Console

from hooktrace.analysis.listing import firing_order, group_modules
from hooktrace.render.listing import listing_text
from hooktrace.runs.factory import held_hooks
from hooktrace.schema import ROOT
from hooktrace.target import Factory
from tests.oracle import Zoo


def test_listed_order_is_the_firing_order_and_the_root_is_spelled_as_in_the_tree():
    zoo = Zoo()
    kept: dict = {}

    def make():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
        zoo.module(m, "forward_pre", "root_pre")
        zoo.module(m[0], "forward_pre", "a")
        zoo.module(m[0], "forward_pre", "b_prepended", prepend=True)
        zoo.module(m[0], "forward", "c")
        zoo.module(m[1], "forward", "d", always_call=True)
        zoo.module(m[1], "forward", "e_prepended", prepend=True)
        kept["model"] = m
        return m, torch.randn(1, 3)

    found = held_hooks(Factory(spec="test:make", func=make, label="make()"))
    rows = firing_order(found.trace, found.live)
    listed = [zoo.labels[h.id] for row in rows for h in row.hooks]
    kept["model"](torch.randn(1, 3))  # PyTorch fires them now: the hooks record their own order
    assert listed == zoo.log == ["root_pre", "b_prepended", "a", "c", "e_prepended", "d"]
    groups = group_modules(rows)
    console = Console(width=120, color_system=None, record=True, file=open("/dev/null", "w"))
    console.print(listing_text(found.trace, groups, found.live))
    text = console.export_text()
    assert f"\n{ROOT}  Sequential" in text and "(root)" not in text
    assert "1. hook_b_prepended  [prepend]" in text and "[always]" in text


def _listing(make) -> tuple:  # noqa: ANN001
    found = held_hooks(Factory(spec="test:make", func=make, label="make()"))
    rows = firing_order(found.trace, found.live)
    console = Console(width=160, color_system=None, record=True, file=open("/dev/null", "w"))
    console.print(listing_text(found.trace, group_modules(rows), found.live))
    return found, rows, console.export_text()


def test_deep_copies_hooks_are_listed_as_copies_in_firing_order_not_folded_into_the_original():
    zoo = Zoo()
    kept: dict = {}

    def make():
        layer = nn.Linear(3, 3)
        zoo.module(layer, "forward_pre", "orig")
        m = nn.Sequential(layer, *(copy.deepcopy(layer) for _ in range(3)))
        kept["model"] = m
        return m, torch.randn(1, 3)

    found, rows, text = _listing(make)
    listed = [row.module for row in rows for _ in row.hooks]
    assert listed == ["0", "1", "2", "3"]  # the copies' hooks are there, one each
    assert len({h.id for row in rows for h in row.hooks}) == 4
    kept["model"](torch.randn(1, 3))  # PyTorch fires the original's and the three copies' hooks
    assert zoo.log == ["orig"] * 4
    assert "more with the same hooks" not in text  # a copy is not "the same hooks" as another module's
    assert text.count("copied with its module (copy.deepcopy) from the hook of 0 registered at") == 3


def test_global_optimizer_and_module_hooks_are_each_said_for_what_they_fire_for():
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    handles = []

    def make():
        handles.append(register_optimizer_step_pre_hook(lambda *a: None))
        return nn.Linear(3, 3), torch.randn(1, 3)

    try:
        _, _, text = _listing(make)
        assert "global optimizer hooks (1) fire around every optimizer's step()" in text
        assert "fire first for every module" not in text  # nearest case below: a global module hook
        handles.append(nn.modules.module.register_module_forward_hook(lambda *a: None))
        _, _, text = _listing(lambda: (nn.Linear(3, 3), torch.randn(1, 3)))
        assert "global module hooks (1) fire first for every module" in text
        assert "optimizer hooks" in text  # the optimizer hook registered by the first factory is still there
    finally:
        for h in handles:
            h.remove()
