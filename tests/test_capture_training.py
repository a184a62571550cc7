"""A whole training step: optimizer, autograd-node and saved-tensor hooks, traced vs untraced.

Every hook logs its own label as it runs; hooktrace's order must equal that log. Restoration: the
optimizer dicts, `Optimizer`'s methods, each optimizer class's `step`, `saved_tensors_hooks`.
Forward wrappers, DDP comm hooks and the samples: tests/test_capture_wrappers.py.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.optim.optimizer as optim_module
from torch import nn
from torch.autograd.graph import save_on_cpu, saved_tensors_hooks
from torch.utils.checkpoint import checkpoint

import hooktrace
from hooktrace.capture.records import SYNTHETIC_BASE

from .training_hooks import (
    Log,
    add_hook_to_module,
    by_name,
    class_state,
    model,
    optimizer_state,
    pytorch_step_code,
)

# -- optimizer hooks ---------------------------------------------------------------------------


def test_optimizer_step_hooks_order_kinds_sites_phase_and_restore():
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    classes = class_state()
    before = optimizer_state(opt)
    L = Log()
    side = nn.Linear(2, 2)
    with hooktrace.trace(m) as t:
        h = [
            opt.register_step_pre_hook(L.fn("pre")),
            opt.register_step_post_hook(L.fn("post")),
            optim_module.register_optimizer_step_pre_hook(L.fn("gpre")),
            optim_module.register_optimizer_step_post_hook(L.fn("gpost")),
            opt.register_step_pre_hook(
                lambda o, a, k: (side(torch.ones(2)), None)[1]
            ),  # a module call in the step
        ]
        inside = optimizer_state(opt)
        assert inside["_optimizer_step_pre_hooks"][0][1].__qualname__ == "hook_pre"  # what was registered
        m(torch.randn(3, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    for handle in h:
        handle.remove()
    assert L.traced(t.trace) == L.log == ["gpre", "pre", "post", "gpost"]
    trace = t.trace
    assert (by_name(trace, "pre").kind, by_name(trace, "pre").scope) == ("optimizer_step_pre", "optimizer")
    assert (by_name(trace, "gpost").kind, by_name(trace, "gpost").scope) == ("optimizer_step_post", "global")
    assert by_name(trace, "pre").module is None and by_name(trace, "pre").tensor is None
    here = os.path.basename(__file__)
    assert by_name(trace, "gpre").registered_at.split(":")[0].endswith(here)
    step_events = [e for e in trace.events if e.kind and e.kind.startswith("optimizer_step")]
    assert step_events and {e.phase for e in step_events} == {"optimizer"}
    side_calls = [e for e in trace.events if e.type == "enter" and e.phase == "optimizer"]
    assert len(side_calls) == 1  # the module called from the pre-hook ran inside optimizer.step()
    assert not [e for e in trace.events if e.type == "enter" and e.phase == "optimizer" and e.module == ""]
    assert optimizer_state(opt) == before
    assert class_state() == classes
    assert type(opt).step.__code__ is pytorch_step_code()


def test_optimizer_class_first_patched_inside_the_block_gets_pytorchs_wrapper_back():
    m = model()
    # PyTorch wraps SGD.step at the first SGD made in the process; without one, super().step below
    # runs no hooks, traced or not (the test passed only after another test had made an SGD)
    torch.optim.SGD(model().parameters(), lr=0.1)
    L = Log()
    with hooktrace.trace(m) as t:

        class MySGD(torch.optim.SGD):
            def step(self, closure=None):  # type: ignore[override]
                L.log.append("inner")
                return super().step(closure)

        opt = MySGD(m.parameters(), lr=0.1)
        opt.register_step_pre_hook(L.fn("pre"))
        m(torch.randn(2, 4)).sum().backward()
        opt.step()
    assert getattr(MySGD.step, "hooked", False)
    assert MySGD.step.__code__ is pytorch_step_code()
    # MySGD.step's wrapper runs the hooks, then SGD.step's wrapper (super().step) runs them again
    assert L.log == ["pre", "inner", "pre"] and L.traced(t.trace) == ["pre", "pre"]
    opt.step()  # after the block: PyTorch's own wrappers, hooks still registered
    assert L.log == ["pre", "inner", "pre"] * 2


def test_optimizer_state_dict_hooks():
    m = model()
    opt = torch.optim.Adam(m.parameters())
    before = optimizer_state(opt)
    L = Log()
    with hooktrace.trace(m) as t:
        hs = [
            opt.register_state_dict_pre_hook(L.fn("sd_pre")),
            opt.register_state_dict_post_hook(L.fn("sd_post", returns=lambda o, sd: dict(sd))),
            opt.register_state_dict_post_hook(L.fn("sd_post_first"), prepend=True),
            opt.register_load_state_dict_pre_hook(L.fn("load_pre")),
            opt.register_load_state_dict_post_hook(L.fn("load_post")),
        ]
        sd = opt.state_dict()
        opt.load_state_dict(sd)
    for h in hs:
        h.remove()
    trace = t.trace
    assert L.traced(trace) == L.log == ["sd_pre", "sd_post_first", "sd_post", "load_pre", "load_post"]
    kinds = {h.name[len("hook_") :]: h.kind for h in trace.hooks if h.name.startswith("hook_")}
    assert kinds == {
        "sd_pre": "optimizer_state_dict_pre",
        "sd_post": "optimizer_state_dict",
        "sd_post_first": "optimizer_state_dict",
        "load_pre": "optimizer_load_state_dict_pre",
        "load_post": "optimizer_load_state_dict_post",
    }
    first = by_name(trace, "sd_post_first")
    assert (first.prepend, first.prepend_source) == (True, "registration")
    returned = {trace.hook(e.hook).name: e.returned for e in trace.hook_events()}
    assert returned["hook_sd_post"] is True and returned["hook_sd_pre"] is False
    assert {e.phase for e in trace.hook_events()} == {"other"}
    assert optimizer_state(opt) == before


# -- autograd-node hooks -------------------------------------------------------------------------


class Triple(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 3


def test_node_hooks_on_grad_fn_accumulate_grad_and_custom_function():
    m = model()
    L = Log()
    classes = class_state()
    w = m[0].weight
    acc = w.view_as(w).grad_fn.next_functions[0][0]
    acc.register_hook(L.fn("acc_before_block"))  # C++ holds it: seen once the node gets another
    with hooktrace.trace(m) as t:
        acc.register_prehook(L.fn("acc_pre"))
        acc.register_hook(L.fn("acc_post"))
        y = Triple.apply(m(torch.randn(3, 4)))
        y.grad_fn.register_prehook(L.fn("fn_pre"))
        y.grad_fn.register_hook(L.fn("fn_post"))
        out = y.sum()
        node = out.grad_fn
        node.register_hook(L.fn("sum_post", returns=lambda gi, go: tuple(g * 1 for g in gi)))
        removed = node.register_prehook(L.fn("removed"))
        removed.remove()
        m[2].register_full_backward_hook(L.fn("module_bwd"))  # its BackwardHook node hooks are plumbing
        out.backward()
    trace = t.trace
    assert L.traced(trace) == L.log
    assert L.log.index("sum_post") < L.log.index("fn_pre") < L.log.index("fn_post") < L.log.index("acc_pre")
    assert L.log.index("acc_pre") < L.log.index("acc_before_block") < L.log.index("acc_post")
    hooks = {h.name[len("hook_") :]: h for h in trace.hooks if h.name.startswith("hook_")}
    assert hooks["acc_pre"].kind == "node_pre" and hooks["acc_post"].kind == "node"
    assert (hooks["acc_before_block"].kind, hooks["acc_before_block"].registered_at) == ("node", None)
    assert hooks["fn_pre"].kind == "node_pre" and hooks["fn_post"].kind == "node"
    assert {hooks[k].scope for k in ("acc_pre", "acc_post", "fn_pre", "sum_post", "removed")} == {"node"}
    assert (hooks["acc_post"].module, hooks["acc_post"].tensor) == ("0", "0.weight")
    assert (hooks["fn_post"].module, hooks["fn_post"].tensor) == (None, None)
    assert hooks["removed"].removed_during_run is False
    assert hooks["acc_pre"].registered_at.split(":")[0].endswith(os.path.basename(__file__))
    sum_events = [e for e in trace.hook_events() if e.hook == hooks["sum_post"].id]
    assert sum_events[0].returned is True and sum_events[0].phase == "backward"
    # only the user's node hooks: none from BackwardHook's plumbing
    assert {h.scope for h in trace.hooks if not h.name.startswith("hook_")} <= {"module", "global", "tensor"}
    assert class_state() == classes
    # after the block the node's own hooks run, and nothing records into the finished trace
    n = len(trace.events)
    L.log.clear()
    y2 = Triple.apply(m(torch.randn(3, 4)))
    y2.sum().backward()
    assert L.log[-3:] == ["acc_pre", "acc_before_block", "acc_post"]
    shims = hooktrace.capture.shims.SHIM_CODES
    assert len(t.trace.events) == n and not any(getattr(f, "__code__", None) in shims for f in (acc,))


# -- saved-tensor hooks --------------------------------------------------------------------------


def test_saved_tensors_hooks_save_on_cpu_and_checkpoint_recompute():
    m = model()
    L = Log()
    classes = class_state()
    pack, unpack = L.fn("pack", returns=lambda x: x), L.fn("unpack", returns=lambda x: x)
    with hooktrace.trace(m) as t:
        ctx = saved_tensors_hooks(pack, unpack)
        with ctx:
            assert ctx.pack_hook is pack and ctx.unpack_hook is unpack
            y = m(torch.randn(3, 4, requires_grad=True))
        with ctx:  # the same object again: the same ids
            y = y * y
        with save_on_cpu():
            z = torch.tanh(y).sum()
        w = checkpoint(lambda a: m[2](torch.tanh(m[0](a))), torch.randn(3, 4), use_reentrant=False).sum()
        (z + w).backward()
    trace = t.trace
    assert L.traced(trace) == L.log and L.log.count("pack") == L.log.count("unpack") > 0
    mine = [h for h in trace.hooks if h.name in ("hook_pack", "hook_unpack")]
    assert len(mine) == 2 and {h.kind for h in mine} == {"pack", "unpack"}
    assert all(h.scope == "saved_tensors" and h.id >= SYNTHETIC_BASE for h in mine)
    assert all(h.registered_at.split(":")[0].endswith(os.path.basename(__file__)) for h in mine)
    kinds = {h.kind for h in trace.hooks if h.scope == "saved_tensors"}
    assert kinds == {"pack", "unpack"} and len({h.id for h in trace.hooks}) == len(trace.hooks)
    cpu = [h for h in trace.hooks if h.scope == "saved_tensors" and "save_on_cpu" in h.name]
    assert cpu and all(h.registered_at.split(":")[0].endswith(os.path.basename(__file__)) for h in cpu)
    ckpt = [
        h for h in trace.hooks if h.scope == "saved_tensors" and h.registered_at.startswith("torch/utils/")
    ]
    forward_time = [
        h for h in ckpt if not h.registered_during_run
    ]  # the recompute's own are entered in backward
    assert forward_time and all(
        h.registered_by.split(":")[0].endswith(os.path.basename(__file__)) for h in forward_time
    )
    # the first unpack of checkpoint's hooks triggers the recompute: recompute calls follow it
    events = trace.events
    recompute = [e for e in events if e.type == "enter" and e.phase == "recompute"]
    assert recompute
    first = recompute[0].seq
    before = [e for e in events[:first] if e.kind == "unpack"]
    assert (
        before
        and "checkpoint" in trace.hook(before[-1].hook).name.lower()
        or "unpack" in trace.hook(before[-1].hook).name
    )
    packs = [e for e in events if e.kind == "pack" and trace.hook(e.hook).name == "hook_pack"]
    assert {e.module for e in packs} >= {"0", "2"}  # each pack names the module call it ran in
    assert class_state() == classes


# -- traced vs untraced, and the whole training step -----------------------------------------------


def training_step(traced: bool, optimizer: str, fail: bool = False) -> tuple:
    """Every hook kind of this file registered inside the block, on one step."""
    m = model()
    opt = (torch.optim.SGD if optimizer == "sgd" else torch.optim.Adam)(m.parameters(), lr=0.1)
    L = Log()
    x = torch.randn(5, 4, requires_grad=True)
    error = None
    classes = class_state()

    def body() -> None:
        opt.register_step_pre_hook(L.fn("opt_pre"))
        opt.register_step_post_hook(L.fn("opt_post"))
        g = [
            optim_module.register_optimizer_step_pre_hook(L.fn("g_pre")),
            optim_module.register_optimizer_step_post_hook(L.fn("g_post")),
        ]
        opt.register_state_dict_post_hook(L.fn("opt_sd"))
        if fail:
            opt.register_step_pre_hook(L.fn("boom", returns=lambda *a: 1 / 0))
        m[0].register_forward_pre_hook(L.fn("fpre0"))
        m[2].register_forward_hook(L.fn("fwd2"))
        m[2].register_full_backward_hook(L.fn("bwd2"))
        add_hook_to_module(m[1], L.log)
        b = m[2].bias
        b.register_post_accumulate_grad_hook(L.fn("pag_b"))  # an "optimizer in backward" step
        acc = b.view_as(b).grad_fn.next_functions[0][0]
        acc.register_hook(L.fn("acc_b"))
        try:
            with saved_tensors_hooks(L.fn("pack", returns=lambda t: t), L.fn("unpack", returns=lambda t: t)):
                h = checkpoint(m[0], x, use_reentrant=False)
            y = m[2](m[1](h))
            y.grad_fn.register_prehook(L.fn("y_pre"))
            y.sum().backward()
            opt.step()
            opt.zero_grad()
            opt.state_dict()
        finally:
            for handle in g:
                handle.remove()

    if traced:
        with hooktrace.trace(m) as t:
            try:
                body()
            except ZeroDivisionError as exc:
                error = repr(exc)
        trace = t.trace
    else:
        try:
            body()
        except ZeroDivisionError as exc:
            error = repr(exc)
        trace = None
    params = [p.detach().clone() for p in m.parameters()]
    registered = {a: [getattr(f, "__qualname__", None) for f in v] for a, v in optimizer_state(opt).items()}
    return L, trace, params, x.grad, error, registered, classes == class_state()


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_whole_training_step_every_hook_in_order_and_restored(optimizer):
    plain = training_step(False, optimizer)
    L, trace, params, xgrad, error, before, after = training_step(True, optimizer)
    assert error is None and L.log == plain[0].log
    assert all(torch.equal(a, b) for a, b in zip(params, plain[2])) and torch.equal(xgrad, plain[3])
    wrapper_events = [e for e in trace.hook_events() if e.kind == "forward_wrapper"]
    ours = L.traced(trace)
    expected = [label for label in L.log if not label.startswith("wrapper:")]
    assert ours == expected
    assert len(wrapper_events) == L.log.count("wrapper:Tanh") == 1
    kinds = {trace.hook(e.hook).name: e.kind for e in trace.hook_events()}
    assert {kinds[f"hook_{k}"] for k in ("opt_pre", "g_pre")} == {"optimizer_step_pre"}
    assert kinds["hook_opt_sd"] == "optimizer_state_dict" and kinds["hook_y_pre"] == "node_pre"
    assert kinds["hook_acc_b"] == "node" and kinds["hook_pag_b"] == "post_accumulate_grad"
    assert {kinds["hook_pack"], kinds["hook_unpack"]} == {"pack", "unpack"}
    assert before == plain[5] and after is True  # the same hooks registered, every class restored


def test_traced_and_untraced_raise_the_same_exception():
    plain = training_step(False, "sgd", fail=True)
    traced = training_step(True, "sgd", fail=True)
    assert plain[4] == traced[4] and plain[4] is not None
    assert traced[0].log == plain[0].log and traced[0].traced(traced[1]) == [
        label for label in plain[0].log if not label.startswith("wrapper:")
    ]
    boom = [e for e in traced[1].hook_events() if traced[1].hook(e.hook).name == "hook_boom"]
    assert boom[0].error.startswith("ZeroDivisionError")
    assert traced[5] == plain[5] and traced[6] is True


def test_no_capture_objects_left_in_dicts_after_the_block():
    opt = torch.optim.SGD(model().parameters(), lr=0.1)
    with hooktrace.trace():
        opt.register_step_pre_hook(L := Log().fn("x"))
    assert list(opt._optimizer_step_pre_hooks.values()) == [L]
    assert dict(optim_module._global_optimizer_pre_hooks) == {}
