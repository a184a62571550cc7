"""Each surprise rule, made to happen for real in PyTorch, with the exact hooks and events it names."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import hooktrace
from tests.oracle import Zoo


def lin() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))


def rules(trace: hooktrace.Trace, rule: str) -> list:
    return [s for s in trace.surprises if s.rule == rule]


def hook_seqs(trace: hooktrace.Trace, hook_id: int) -> list[int]:
    return [e.seq for e in trace.events if e.type == "hook" and e.hook == hook_id]


def test_global_first():
    m = lin()
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        g = zoo.glob("forward_pre", "global_pre")
        p = zoo.module(m[0], "forward_pre", "prepended", prepend=True)
        m(torch.randn(1, 3))
        g.remove()
        p.remove()
    assert zoo.traced(t.trace) == zoo.log == ["global_pre", "global_pre", "prepended", "global_pre"]
    [s] = rules(t.trace, "global-first")
    assert s.hooks == [p.id, g.id]
    g_seq = hook_seqs(t.trace, g.id)[1]
    assert s.events == [g_seq, hook_seqs(t.trace, p.id)[0]]
    assert "`hook_prepended`" in s.message and "`hook_global_pre`" in s.message


def test_prepend_displaced():
    m = lin()
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        early = zoo.module(m[0], "forward", "early_prepend", prepend=True)
        later = zoo.module(m[0], "forward", "later_prepend", prepend=True)
        m(torch.randn(1, 3))
    early.remove()
    later.remove()
    assert zoo.log == ["later_prepend", "early_prepend"]
    [s] = rules(t.trace, "prepend-displaced")
    assert s.hooks == [early.id, later.id]
    assert s.events == [hook_seqs(t.trace, later.id)[0], hook_seqs(t.trace, early.id)[0]]
    assert not rules(t.trace, "global-first")


def test_recompute_and_early_stop():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 3)

        def inner(self, x):
            return self.b(torch.tanh(self.a(x)))

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False).sum()

    torch.manual_seed(0)
    m = Net()
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        ha = zoo.module(m.a, "forward", "a_fwd")
        hb = zoo.module(m.b, "forward", "b_fwd")
        m(torch.randn(2, 3, requires_grad=True)).backward()
    ha.remove()
    hb.remove()
    [s] = rules(t.trace, "recompute")
    recomputed = [
        e
        for e in t.trace.events
        if e.type == "hook" and e.phase == "recompute" and e.kind in ("forward_pre", "forward")
    ]  # checkpoint's own pack hooks also run in the recompute
    assert recomputed and s.hooks == sorted({e.hook for e in recomputed})
    assert set(s.events) >= {e.seq for e in recomputed}
    assert zoo.traced(t.trace) == zoo.log


def test_replaced_value():
    m = lin()
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        doubler = zoo.module(m[0], "forward", "doubler", returns=lambda mod, args, out: out * 2)
        watcher = zoo.module(m[0], "forward", "watcher")
        m(torch.randn(1, 3))
    doubler.remove()
    watcher.remove()
    [s] = rules(t.trace, "replaced-value")
    assert s.hooks == [doubler.id] and s.events == hook_seqs(t.trace, doubler.id)
    assert "the module's output" in s.message


def test_legacy_backward():
    m = lin()
    zoo = Zoo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with hooktrace.trace(m) as t:
            h = zoo.module(m[1], "backward_legacy", "legacy")
            m(torch.randn(1, 3, requires_grad=True)).sum().backward()
    h.remove()
    [s] = rules(t.trace, "legacy-backward")
    assert s.hooks == [h.id] and s.events == hook_seqs(t.trace, h.id)
    assert "register_full_backward_hook" in s.message


def test_hook_error_names_always_call_hooks_that_still_ran():
    m = lin()
    zoo = Zoo()
    with pytest.raises(KeyError):
        with hooktrace.trace(m) as t:
            bad = zoo.module(m[0], "forward_pre", "bad", raises=KeyError("nope"))
            always = zoo.module(m[0], "forward", "always", always_call=True)
            zoo.module(m[0], "forward", "normal")
            m(torch.randn(1, 3))
    bad.remove()
    always.remove()
    assert zoo.traced(t.trace) == zoo.log == ["bad", "always"]
    [s] = rules(t.trace, "hook-error")
    assert s.hooks == [bad.id, always.id]
    assert s.events == [hook_seqs(t.trace, bad.id)[0], hook_seqs(t.trace, always.id)[0]]
    assert "KeyError" in s.message


def test_output_hook_before_backward_pre():
    torch.manual_seed(0)
    inner = nn.Linear(3, 3)
    m = nn.Sequential(inner)
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        pre = zoo.module(inner, "backward_pre", "inner_backward_pre")

        def on_root_output(module, args, output):
            handle = output.register_hook(zoo.fn("root_output_grad"))
            zoo.labels[handle.id] = "root_output_grad"

        root = m.register_forward_hook(on_root_output)
        m(torch.randn(2, 3, requires_grad=True)).sum().backward()
    pre.remove()
    root.remove()
    assert zoo.traced(t.trace) == zoo.log == ["root_output_grad", "inner_backward_pre"]
    [s] = rules(t.trace, "output-hook-before-backward-pre")
    out_hook = next(h for h in t.trace.hooks if h.name == "hook_root_output_grad")
    # the root returns inner's output as is: it is the output of the module with the backward pre-hook
    assert out_hook.tensor == "output of 0"
    assert s.hooks == [out_hook.id, pre.id]
    assert s.events == [hook_seqs(t.trace, out_hook.id)[0], hook_seqs(t.trace, pre.id)[0]]


def test_tensor_hook_in_own_forward_hook_runs_after_backward_pre():
    """The order the `prepend` PR discussed: a forward hook's output is not yet the hooked output."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 3))
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        pre = zoo.module(m[0], "backward_pre", "backward_pre")

        def on_output(module, args, output):
            handle = output.register_hook(zoo.fn("output_grad"))
            zoo.labels[handle.id] = "output_grad"

        fwd = m[0].register_forward_hook(on_output)
        m(torch.randn(2, 3, requires_grad=True)).sum().backward()
    pre.remove()
    fwd.remove()
    assert zoo.traced(t.trace) == zoo.log == ["backward_pre", "output_grad"]
    assert next(h for h in t.trace.hooks if h.name == "hook_output_grad").tensor == "output of 0"
    assert not rules(t.trace, "output-hook-before-backward-pre")


# -- the nearest situations where a rule must NOT fire, and the wording of the ones that do -------


def test_global_first_not_for_globals_of_another_kind():
    m = lin()
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        g = zoo.glob("forward", "global_fwd")
        p = zoo.module(m[0], "forward_pre", "prepended", prepend=True)
        m(torch.randn(1, 3))
        g.remove()
        p.remove()
    assert zoo.traced(t.trace) == zoo.log
    assert not rules(t.trace, "global-first")


def test_prepend_displaced_not_for_a_module_called_twice():
    """A shared layer: the same prepended hooks fire once per call, twice in a row in backward."""
    torch.manual_seed(0)
    layer = nn.Linear(3, 3)
    zoo = Zoo()
    with hooktrace.trace(layer) as t:
        first = zoo.module(layer, "backward_pre", "first")
        pre = zoo.module(layer, "backward_pre", "prepended", prepend=True)
        fwd = zoo.module(layer, "forward_pre", "fwd_prepended", prepend=True)
        layer(layer(torch.randn(2, 3, requires_grad=True))).sum().backward()
    for h in (first, pre, fwd):
        h.remove()
    assert zoo.log == ["fwd_prepended", "fwd_prepended", "prepended", "first", "prepended", "first"]
    assert zoo.traced(t.trace) == zoo.log
    assert not rules(t.trace, "prepend-displaced")


class HookPoint(nn.Module):
    """TransformerLens' hook point: identity module; `add_hook(prepend=True)` moves the hook to the front."""

    def forward(self, x):
        return x

    def add_hook(self, hook, prepend=False):
        def full_hook(module, module_input, module_output):
            return hook(module_output, hook=self)

        handle = self.register_forward_hook(full_hook)
        if prepend:
            self._forward_hooks.move_to_end(handle.id, last=False)
        return handle


def test_prepend_displaced_not_for_transformer_lens_hook_points_called_twice():
    point = HookPoint()
    model = nn.Sequential(point)
    seen: list[str] = []
    with hooktrace.trace(model) as t:
        a = point.add_hook(lambda act, hook: seen.append("a"))
        b = point.add_hook(lambda act, hook: seen.append("b"), prepend=True)
        x = torch.randn(2, 3)
        model(x)
        point(x)  # called again, outside its parent
    a.remove()
    b.remove()
    assert seen == ["b", "a", "b", "a"]
    assert not rules(t.trace, "prepend-displaced")


def test_prepend_displaced_by_a_hook_moved_to_the_front_directly():
    m = lin()
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        early = zoo.module(m[0], "forward", "early")
        pre = zoo.module(m[0], "forward", "prepended", prepend=True)
        # the dict edited directly, as nnsight and TransformerLens do
        m[0]._forward_hooks.move_to_end(early.id, last=False)
        m(torch.randn(1, 3))
    early.remove()
    pre.remove()
    assert zoo.traced(t.trace) == zoo.log == ["early", "prepended"]
    [s] = rules(t.trace, "prepend-displaced")
    assert s.hooks == [pre.id, early.id]
    assert "without prepend=True" in s.message and "registered later with prepend" not in s.message
    assert s.level == "warn"


def test_recompute_does_not_blame_hooks_outside_the_checkpoint():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = nn.Sequential(nn.Linear(3, 3), nn.GELU(), nn.Linear(3, 3))
            self.head = nn.Linear(3, 1)

        def forward(self, x):
            return self.head(checkpoint(self.block, x, use_reentrant=False))

    torch.manual_seed(0)
    m = Net()
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        inside = [zoo.module(sub, "forward", f"in{i}") for i, sub in enumerate(m.block)]
        outside = zoo.module(m.head, "forward", "head_fwd")
        m(torch.randn(2, 3, requires_grad=True)).sum().backward()
    for h in (*inside, outside):
        h.remove()
    assert zoo.traced(t.trace) == zoo.log
    [s] = rules(t.trace, "recompute")
    assert outside.id not in s.hooks and "hook_head_fwd" not in s.message
    recomputed = {
        e.hook
        for e in t.trace.events
        if e.type == "hook" and e.phase == "recompute" and e.kind in ("forward_pre", "forward")
    }
    assert recomputed and set(s.hooks) == recomputed
    stopped = [e for e in t.trace.events if e.type == "exit" and e.error]
    if stopped:  # what did not re-run is inside the block, and really did not fire in recompute
        skipped = [h for h in inside if f"`hook_{zoo.labels[h.id]}`" in s.message.split("did not re-run")[0]]
        assert all(h.id not in recomputed for h in skipped)


def test_no_recompute_without_checkpoint():
    m = lin()
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        h = zoo.module(m[0], "forward", "fwd")
        m(torch.randn(1, 3, requires_grad=True)).sum().backward()
    h.remove()
    assert not rules(t.trace, "recompute")


def test_replaced_value_wording_counts_calls():
    m = lin()
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        doubler = zoo.module(m[0], "forward", "doubler", returns=lambda mod, args, out: out * 2)
        m(torch.randn(1, 3))
        m(torch.randn(1, 3))
    doubler.remove()
    [s] = rules(t.trace, "replaced-value")
    assert "in 2 calls" in s.message and "time(s)" not in s.message


def test_legacy_backward_not_for_full_backward_hooks():
    m = lin()
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        h = zoo.module(m[1], "backward", "full")
        m(torch.randn(1, 3, requires_grad=True)).sum().backward()
    h.remove()
    assert zoo.traced(t.trace) == zoo.log == ["full"]
    assert not rules(t.trace, "legacy-backward")


def test_hook_error_not_for_checkpoints_own_stop():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(3, 3), nn.GELU(), nn.Linear(3, 3))
    m = nn.Sequential(block)
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        hooks = [zoo.module(sub, "forward", f"f{i}") for i, sub in enumerate(block)]
        checkpoint(block, torch.randn(2, 3, requires_grad=True), use_reentrant=False).sum().backward()
    for h in hooks:
        h.remove()
    assert not rules(t.trace, "hook-error")


def test_registered_during_run_when_calls_differ():
    """A forward hook of `0` registers a pre-hook on `0` itself: the first call ran without it."""
    m = lin()
    zoo = Zoo()
    added = []

    def adds_a_hook(module, args, output):
        if not added:
            added.append(zoo.module(m[0], "forward_pre", "added_in_forward"))

    with hooktrace.trace(m) as t:
        h = m[0].register_forward_hook(adds_a_hook)
        m(torch.randn(1, 3))
        m(torch.randn(1, 3))
    h.remove()
    added[0].remove()
    assert zoo.log == ["added_in_forward"]
    [s] = rules(t.trace, "registered-during-run")
    assert s.hooks == [added[0].id]
    assert "1 call of `0` ran without it and 1 with it" in s.message


def test_registered_during_run_once_per_hook_and_module_for_per_forward_hooks():
    """PEFT's way: each forward registers a pre-hook on its layers, runs them, removes it (24
    duplicated surprises before): one surprise per hook and module, every registration listed."""
    torch.manual_seed(0)
    m = lin()
    log: list[str] = []

    def adapter(module, args):
        log.append(f"adapter{0 if module is m[0] else 1}")

    class PerForward(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = m

        def forward(self, x):
            handles = [m[0].register_forward_pre_hook(adapter), m[1].register_forward_pre_hook(adapter)]
            try:
                return self.inner(x)
            finally:
                for h in handles:
                    h.remove()

    model = PerForward()
    with hooktrace.trace(model) as t:
        for _ in range(4):
            model(torch.randn(1, 3))
    assert [f"adapter{ {'inner.0': 0, 'inner.1': 1}[e.module] }" for e in t.trace.hook_events()] == log
    found = rules(t.trace, "registered-during-run")
    assert len(found) == 2  # one per module, not one per registration
    for s, module in zip(found, ("inner.0", "inner.1")):
        mine = [h.id for h in t.trace.hooks if h.module == module]
        assert len(mine) == 4 and s.hooks == mine  # each: other calls of its module ran without it
        assert f"`{module}`" in s.message and "4 registrations of it" in s.message


def test_registered_during_run_not_when_every_call_saw_it():
    """Registered on `1` while `0` ran, before `1` was called: every call of `1` had it."""
    m = lin()
    zoo = Zoo()
    added = []

    def adds_a_hook(module, args):
        if not added:
            added.append(zoo.module(m[1], "forward", "added_in_forward"))

    with hooktrace.trace(m) as t:
        h = m[0].register_forward_pre_hook(adds_a_hook)
        m(torch.randn(1, 3))
        m(torch.randn(1, 3))
    h.remove()
    added[0].remove()
    assert zoo.log == ["added_in_forward", "added_in_forward"]
    assert next(x for x in t.trace.hooks if x.id == added[0].id).registered_during_run
    assert not rules(t.trace, "registered-during-run")


def test_library_hooks_are_info_and_user_hooks_warn():
    """Composable checkpoint registers its own hooks (registered_at inside torch, registered_by here)."""
    from torch.distributed._composable import checkpoint as composable_checkpoint

    from hooktrace.analysis.surprises import split_levels

    m = lin()
    unused = nn.Linear(3, 3)
    zoo = Zoo()
    with hooktrace.trace(nn.ModuleList([m, unused])) as t:
        composable_checkpoint(unused)
        mine = zoo.module(unused, "forward", "mine")
        m(torch.randn(1, 3))
    mine.remove()
    library = [h for h in t.trace.hooks if h.registered_at and h.registered_at.startswith("torch/")]
    assert library and all(h.registered_by and h.registered_by.startswith("tests/") for h in library)
    warn, info = split_levels(rules(t.trace, "never-fired"))
    assert [s.hooks for s in warn] == [[mine.id]]
    assert sorted(hid for s in info for hid in s.hooks) == sorted(h.id for h in library)
