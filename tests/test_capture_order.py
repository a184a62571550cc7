"""The traced order equals the order the hooks themselves recorded, for every kind and flag."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.modules.module as nn_module
from torch.utils.checkpoint import checkpoint

import hooktrace
from tests.oracle import Zoo, assert_no_shims, snapshot_dicts


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.act(self.fc(x)) * scale


def line_of(filename: str, text: str) -> int:
    """Line number of the first line of tests/<filename> containing `text`."""
    lines = (Path(__file__).parent / filename).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Block(), Block(), nn.Linear(4, 2))


def run(m: nn.Module, zoo: Zoo, x: torch.Tensor | None = None) -> torch.Tensor:
    x = torch.randn(3, 4, requires_grad=True) if x is None else x
    out = m(x)
    zoo.in_backward = True
    out.sum().backward()
    zoo.in_backward = False
    return out


@pytest.fixture(autouse=True)
def no_global_hooks_left():
    yield
    for attr in (
        "_global_forward_pre_hooks",
        "_global_forward_hooks",
        "_global_backward_pre_hooks",
        "_global_backward_hooks",
    ):
        assert not getattr(nn_module, attr), f"a test leaked a global hook in {attr}"
    nn_module._global_is_full_backward_hook = None


def check(zoo: Zoo, trace: hooktrace.Trace) -> None:
    assert zoo.log, "no hook fired: the test is not testing anything"
    assert zoo.traced(trace) == zoo.log
    for hid, expected in zoo.expected.items():
        hook = trace.hook(hid)
        assert hook.kind == expected["kind"], hook
        assert hook.scope == expected["scope"], hook
        assert hook.with_kwargs == expected.get("with_kwargs", False), hook
        assert hook.always_call == expected.get("always_call", False), hook


def test_forward_hooks_every_flag_registered_inside():
    m = model()
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        handles = [
            zoo.glob("forward_pre", "g_pre"),
            zoo.glob("forward", "g_fwd"),
            zoo.glob("forward", "g_fwd_kw", with_kwargs=True),
            zoo.glob("forward", "g_fwd_always", always_call=True),
            zoo.module(m[0], "forward_pre", "pre_a"),
            zoo.module(m[0], "forward_pre", "pre_b_prepend", prepend=True),
            zoo.module(m[0], "forward_pre", "pre_c_kwargs", with_kwargs=True),
            zoo.module(m[0], "forward", "fwd_a"),
            zoo.module(m[0], "forward", "fwd_b_prepend_kw", prepend=True, with_kwargs=True),
            zoo.module(m[0], "forward", "fwd_c_always", always_call=True),
            zoo.module(m[1].fc, "forward", "fc_fwd"),
        ]
        run(m, zoo)
        for h in handles:
            h.remove()
    check(zoo, t.trace)
    assert t.trace.hook(handles[5].id).prepend_source == "registration"
    assert t.trace.hook(handles[8].id).prepend is True
    assert t.trace.hook(handles[4].id).prepend is False
    assert (
        t.trace.hook(handles[5].id).registered_at
        == f"tests/oracle.py:{line_of('oracle.py', 'handle = method(')}"
    )
    assert t.trace.hook(handles[5].id).registered_by.startswith("tests/oracle.py")
    # phases: forward hooks ran in forward
    phases = {e.phase for e in t.trace.events if e.type == "hook"}
    assert phases == {"forward"}


def test_prepend_before_trace_is_inferred_from_ids():
    m = model()
    zoo = Zoo()
    first = zoo.module(m[0], "forward_pre", "first")
    second = zoo.module(m[0], "forward_pre", "second_prepended", prepend=True)
    lonely = zoo.module(m[1], "forward_pre", "lonely_prepend", prepend=True)
    with hooktrace.trace(m) as t:
        run(m, zoo)
    for h in (first, second, lonely):
        h.remove()
    check(zoo, t.trace)
    assert zoo.log[:2] == ["second_prepended", "first"]
    hook = t.trace.hook(second.id)
    assert (hook.prepend, hook.prepend_source, hook.registered_at) == (True, "inferred", None)
    # a prepend into an empty dict leaves no trace in the order: nothing to infer
    assert t.trace.hook(lonely.id).prepend is False


def test_backward_hooks_full_module_global_and_tensor():
    m = model()
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        handles = [
            zoo.glob("backward_pre", "g_bpre"),
            zoo.glob("backward", "g_bwd"),
            zoo.module(m[0], "backward_pre", "bpre0"),
            zoo.module(m[0], "backward_pre", "bpre0_prepend", prepend=True),
            zoo.module(m[0], "backward", "bwd0"),
            zoo.module(m[2], "backward", "bwd2"),
            zoo.module(m[2], "backward", "bwd2_prepend", prepend=True),
            zoo.tensor(m[0].fc.weight, "grad", "w_grad"),
            zoo.tensor(m[0].fc.weight, "post_accumulate_grad", "w_post"),
            zoo.tensor(m[2].bias, "grad", "bias_grad"),
        ]
        x = torch.randn(3, 4, requires_grad=True)
        zoo.tensor(x, "grad", "input_grad")
        run(m, zoo, x)
        for h in handles:
            h.remove()
    check(zoo, t.trace)
    trace = t.trace
    assert {e.phase for e in trace.events if e.type == "hook" and e.kind != "forward"} == {"backward"}
    w = trace.hook(handles[7].id)
    assert (w.scope, w.module, w.tensor) == ("tensor", "0.fc", "0.fc.weight")
    assert trace.hook(handles[6].id).prepend_source == "registration"
    # global backward hooks fire for the module they run for
    g_events = [e for e in trace.events if e.type == "hook" and e.hook == handles[1].id]
    assert {e.module for e in g_events} >= {"0", "2", ""}


def test_legacy_backward_hooks_module_and_global():
    m = model()
    zoo = Zoo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with hooktrace.trace(m) as t:
            handles = [
                zoo.glob("backward_legacy", "g_legacy"),
                zoo.module(m[2], "backward_legacy", "legacy2"),
            ]
            run(m, zoo)
            for h in handles:
                h.remove()
    check(zoo, t.trace)
    assert {r.rule for r in t.trace.surprises} >= {"legacy-backward"}


def test_intermediate_tensor_hooks_and_multi_grad_hook():
    m = model()
    zoo = Zoo()

    def on_output(module, args, output):
        zoo.log.append("on_output")
        handle = output.register_hook(zoo.fn("out_grad"))
        zoo.labels[handle.id] = "out_grad"

    def all_grads(grads):
        zoo.log.append("multi")

    with hooktrace.trace(m) as t:
        h = m[1].register_forward_hook(on_output)
        zoo.labels[h.id] = "on_output"
        x = torch.randn(3, 4, requires_grad=True)
        out = m(x)
        multi = torch.autograd.graph.register_multi_grad_hook((x, out), all_grads)
        out.sum().backward()
        multi.remove()
        h.remove()
    trace = t.trace
    labelled = [e for e in trace.events if e.type == "hook" and e.hook in zoo.labels]
    assert [zoo.labels[e.hook] for e in labelled] == [x for x in zoo.log if x != "multi"]
    out_hook = next(hk for hk in trace.hooks if zoo.labels.get(hk.id) == "out_grad")
    assert (out_hook.tensor, out_hook.registered_during_run, out_hook.kind) == ("output of 1", True, "grad")
    # one hook of its own, named by the user's function, registered on the test's line; PyTorch's
    # per-tensor inner hooks are no hooks of the trace
    multi_hooks = [hk for hk in trace.hooks if hk.kind == "multi_grad"]
    assert [hk.name for hk in multi_hooks] == [all_grads.__qualname__]
    assert multi_hooks[0].registered_at.startswith("tests/test_capture_order.py")
    assert not [hk for hk in trace.hooks if "inner_hook" in hk.name]
    fired = [e for e in trace.events if e.type == "hook" and e.hook == multi_hooks[0].id]
    assert len(fired) == zoo.log.count("multi") == 1


def test_registered_and_removed_during_run_and_direct_dict_insertion():
    m = model()
    zoo = Zoo()
    late = {}

    def registers_more(module, args):
        zoo.log.append("registers_more")
        if "h" not in late:
            late["h"] = zoo.module(m[2], "forward", "late_fwd")
            late["gone"] = zoo.module(m[2], "forward_pre", "removed_in_run")
            late["gone"].remove()

    with hooktrace.trace(m) as t:
        h = m[0].register_forward_pre_hook(registers_more)
        zoo.labels[h.id] = "registers_more"
        # nnsight style: straight into the dict, with a handle made by hand
        direct = torch.utils.hooks.RemovableHandle(m[1]._forward_hooks)
        m[1]._forward_hooks[direct.id] = zoo.fn("direct")
        zoo.labels[direct.id] = "direct"
        # TransformerLens style: register, then move_to_end to run first
        first = zoo.module(m[1], "forward", "moved_first")
        m[1]._forward_hooks.move_to_end(first.id, last=False)
        run(m, zoo)
        for handle in (h, direct, first, late["h"]):
            handle.remove()
    check(zoo, t.trace)
    trace = t.trace
    assert zoo.log.index("moved_first") < zoo.log.index("direct")
    assert trace.hook(late["h"].id).registered_during_run is True
    assert trace.hook(first.id).prepend_source == "inferred"
    assert trace.hook(direct.id).registered_at.startswith("tests/test_capture_order.py")
    gone = trace.hook(late["gone"].id)
    assert gone.removed_during_run and gone.registered_during_run
    rules = {s.rule for s in trace.surprises}
    # late_fwd went in before m[2]'s only call: no call ran without it, so no registered-during-run
    assert "never-fired" in rules and "registered-during-run" not in rules


class _CallableHook:
    """A hook object of the awkward sort: hashing raises, or it equals everything."""

    def __init__(self, zoo: Zoo, label: str, *, hashable: bool) -> None:
        self.zoo, self.label = zoo, label
        if not hashable:
            self.__class__ = _UnhashableHook

    def __call__(self, *args):
        self.zoo.log.append(self.label)

    def __eq__(self, other):  # claims to equal any object, shims included
        return True

    __hash__ = object.__hash__


class _UnhashableHook(_CallableHook):
    def __hash__(self):  # PyTorch never hashes hooks; hooktrace must not make this matter either
        raise RuntimeError("no hashing")


def test_unhashable_and_equal_to_everything_hook_objects_are_traced():
    """`_call_impl` checks the call dicts against a set of shims; hook objects that are unhashable or
    compare equal to everything must still be wrapped when they appear, registered or put straight in."""
    m = model()
    zoo = Zoo()
    x = torch.randn(3, 4)
    placed = []  # (dict, id, object) as the user put them
    with hooktrace.trace(m) as t:
        run(m, zoo, x)  # the shims exist, so a new object could be taken for one of them
        for i, (module, hashable) in enumerate([(m[0].fc, False), (m[1].fc, True), (m[2], False)]):
            hook = _CallableHook(zoo, f"obj{i}", hashable=hashable)
            handle = module.register_forward_hook(hook)
            zoo.labels[handle.id] = f"obj{i}"
            placed.append((module._forward_hooks, handle.id, hook))
            direct = torch.utils.hooks.RemovableHandle(module._forward_pre_hooks)
            obj = _CallableHook(zoo, f"direct{i}", hashable=hashable)
            module._forward_pre_hooks[direct.id] = obj
            zoo.labels[direct.id] = f"direct{i}"
            placed.append((module._forward_pre_hooks, direct.id, obj))
        t.mark_step()
        run(m, zoo, x)
    assert len(zoo.log) == 6
    check(zoo, t.trace)
    for d, hid, obj in placed:
        assert d[hid] is obj  # the user's object back, not a shim


def test_always_call_hooks_run_after_forward_raises():
    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    m = nn.Sequential(nn.Linear(4, 4), Boom())
    zoo = Zoo()
    before = snapshot_dicts(m)
    handles = [
        zoo.module(m[1], "forward_pre", "pre"),
        zoo.module(m[1], "forward", "not_always"),
        zoo.module(m[1], "forward", "always", always_call=True),
        zoo.glob("forward", "g_always", always_call=True),
    ]
    registered = snapshot_dicts(m)
    with pytest.raises(ValueError, match="boom"):
        with hooktrace.trace(m) as t:
            m(torch.randn(2, 4))
    assert snapshot_dicts(m) == registered
    for h in handles:
        h.remove()
    assert snapshot_dicts(m) == before
    check(zoo, t.trace)
    # Linear ran fine; Boom raised: global always_call, then the module's; then the Sequential re-raised
    assert zoo.log == ["g_always", "pre", "g_always", "always", "g_always"]
    exits = [e for e in t.trace.events if e.type == "exit" and e.module == "1"]
    assert exits[0].error == "ValueError: boom"
    assert exits[0].seq > max(e.seq for e in t.trace.events if e.type == "hook" and e.module == "1")


def test_hook_that_raises_is_recorded_and_dicts_restored():
    m = model()
    zoo = Zoo()
    handles = [
        zoo.module(m[0], "forward", "bad", raises=RuntimeError("bad hook")),
        zoo.module(m[0], "forward", "always", always_call=True),
    ]
    before = snapshot_dicts(m)
    with pytest.raises(RuntimeError, match="bad hook"):
        with hooktrace.trace(m) as t:
            m(torch.randn(2, 4))
    after = snapshot_dicts(m)
    assert after == before
    assert_no_shims(after)
    for h in handles:
        h.remove()
    check(zoo, t.trace)
    errors = [e for e in t.trace.events if e.error]
    assert errors[0].type == "hook" and errors[0].error == "RuntimeError: bad hook"
    surprise = next(s for s in t.trace.surprises if s.rule == "hook-error")
    assert "`hook_always`" in surprise.message and handles[0].id in surprise.hooks


def test_checkpoint_recompute_phase_matches_when_hooks_ran():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Block()
            self.head = nn.Linear(4, 1)

        def forward(self, x):
            return self.head(checkpoint(self.inner, x, use_reentrant=False))

    torch.manual_seed(0)
    m = Net()
    zoo = Zoo()
    phases: list[str] = []

    def phase_hook(label):
        def hook(*args):
            zoo.log.append(label)
            phases.append("recompute" if zoo.in_backward else "forward")

        return hook

    for name, mod in (("inner", m.inner), ("fc", m.inner.fc), ("act", m.inner.act)):
        h = mod.register_forward_pre_hook(phase_hook(f"{name}_pre"))
        zoo.labels[h.id] = f"{name}_pre"
    with hooktrace.trace(m) as t:
        run(m, zoo)
    check(zoo, t.trace)
    traced_phases = [e.phase for e in t.trace.events if e.type == "hook" and e.hook in zoo.labels]
    assert traced_phases == phases
    assert "recompute" in phases
    assert any(s.rule == "recompute" for s in t.trace.surprises)
    recompute_enters = [e for e in t.trace.events if e.type == "enter" and e.phase == "recompute"]
    assert {e.module for e in recompute_enters} >= {"inner", "inner.fc"}


def test_state_dict_hooks_phase_other_and_calling_convention_kept():
    m = model()
    seen = []
    with hooktrace.trace(m) as t:
        m[2].register_state_dict_pre_hook(lambda module, prefix, keep_vars: seen.append("pre"))
        m[2].register_state_dict_post_hook(lambda module, sd, prefix, meta: seen.append("post"))
        m[2]._register_state_dict_hook(lambda module, sd, prefix, meta: seen.append("private"))
        m.register_load_state_dict_post_hook(lambda module, keys: seen.append("load_post"))
        sd = m.state_dict()
        m.load_state_dict(sd)
    assert seen == ["pre", "post", "private", "load_post"]
    kinds = [e.kind for e in t.trace.events if e.type == "hook"]
    assert kinds == ["state_dict_pre", "state_dict", "state_dict", "load_state_dict_post"]
    assert {e.phase for e in t.trace.events if e.type == "hook"} == {"other"}
    assert set(sd) == set(model().state_dict())
