"""Hook ids hooktrace makes (deep copies', synthetic) never collide, whatever the counts."""

from __future__ import annotations

import copy
import itertools

import torch
from torch import nn

import hooktrace
from hooktrace import ids


def test_copy_and_synthetic_ids_never_meet_handle_ids_or_each_other():
    handles = range(0, 3000, 7)  # handle ids: PyTorch's counter, below ids.BLOCK
    copies = {ids.copy_id(n, h) for n, h in zip(range(1, 5000), itertools.cycle(handles))}
    synthetic = set(itertools.islice(ids.synthetic_ids(), 5000))
    assert len(copies) == 4999 and len(synthetic) == 5000
    assert not copies & synthetic and not copies & set(handles) and not synthetic & set(handles)
    assert all(ids.copy_of(ids.copy_id(n, 42)) == 42 for n in (1, 999, 1000, 1001, 10**6))
    assert ids.copy_of(42) is None and all(ids.copy_of(s) is None for s in synthetic)
    assert {ids.family(h) for h in handles} == {0} and {ids.family(s) for s in synthetic} == {1}
    assert {ids.family(c) for c in copies} == {2}


def test_over_a_thousand_copied_hooks_and_pack_unpack_hooks_each_keep_their_own_id():
    fired: list[str] = []
    layer = nn.Linear(2, 2)
    layer.register_forward_pre_hook(lambda m, a: fired.append("pre"))
    with hooktrace.trace() as t:
        copies = [copy.deepcopy(layer) for _ in range(1005)]
        x = torch.randn(1, 2, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(lambda t_: t_, lambda t_: t_):
            out = sum(c(x).sum() for c in copies)
        out.backward()
    trace = t.trace
    hook_ids = [h.id for h in trace.hooks]
    assert len(hook_ids) == len(set(hook_ids))
    pre = [h for h in trace.hooks if h.kind == "forward_pre"]
    assert len(pre) == 1005 and len(fired) == 1005  # every copy's hook, none lost to another's id
    # the first dict seen holding the handle id keeps it; every other one is a copy's id
    assert sum(ids.copy_of(h.id) is None for h in pre) == 1
    packs = [h for h in trace.hooks if h.kind in ("pack", "unpack")]
    assert sorted(h.kind for h in packs) == ["pack", "unpack"]
    per_hook = {h.id: 0 for h in pre}
    for e in trace.hook_events():
        if e.hook in per_hook:
            per_hook[e.hook] += 1
    assert set(per_hook.values()) == {1}  # each copy's hook fired once, under its own id
