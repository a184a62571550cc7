"""`hooktrace hooks`: the listed order is the order PyTorch then fires the hooks (oracle)."""

from __future__ import annotations

import torch
import torch.nn as nn
from rich.console import Console

from hooktrace.analysis.inventory import firing_order, group_modules
from hooktrace.render.inventory import inventory_text
from hooktrace.runs.factory import inventory
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

    found = inventory(Factory(spec="test:make", func=make, label="make()"))
    rows = firing_order(found.trace, found.live)
    listed = [zoo.labels[h.id] for row in rows for h in row.hooks]
    kept["model"](torch.randn(1, 3))  # PyTorch fires them now: the hooks record their own order
    assert listed == zoo.log == ["root_pre", "b_prepended", "a", "c", "e_prepended", "d"]
    groups = group_modules(rows)
    console = Console(width=120, color_system=None, record=True, file=open("/dev/null", "w"))
    console.print(inventory_text(found.trace, groups, found.live))
    text = console.export_text()
    assert f"\n{ROOT}  Sequential" in text and "(root)" not in text
    assert "1. hook_b_prepended  [prepend]" in text and "[always]" in text
