"""Capture, continued: restoration, references kept, steps and threads, registrations kept past a capture.

The oracle is the same as in test_capture_order.py: hooks record themselves; traced order == record.
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn as nn
import torch.nn.modules.module as nn_module

import hooktrace
from tests.oracle import Zoo, assert_no_shims, snapshot_dicts
from tests.test_capture_order import Block, check, line_of, model, no_global_hooks_left, run  # noqa: F401


def test_outputs_and_gradients_bitwise_equal_with_and_without_tracing():
    def once(traced: bool):
        m = model()
        zoo = Zoo()
        zoo.module(m[0], "forward", "double", returns=lambda mod, args, out: out * 2)
        zoo.module(m[1], "backward", "b")
        zoo.tensor(m[2].weight, "grad", "g", returns=lambda g: g * 0.5)
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
        if traced:
            with hooktrace.trace(m):
                out = run(m, zoo, x)
        else:
            out = run(m, zoo, x)
        return out.detach(), [p.grad.clone() for p in m.parameters()], x.grad.clone(), zoo.log

    plain, traced = once(False), once(True)
    assert torch.equal(plain[0], traced[0])
    assert all(torch.equal(a, b) for a, b in zip(plain[1], traced[1]))
    assert torch.equal(plain[2], traced[2])
    assert plain[3] == traced[3]


def test_restore_keeps_hooks_registered_inside_and_unwrapped():
    m = model()
    zoo = Zoo()
    old = zoo.module(m[0], "forward", "old")
    removed_inside = zoo.module(m[1], "forward", "removed_inside")
    with hooktrace.trace(m):
        new = zoo.module(m[2], "forward_pre", "new", prepend=True)
        g = zoo.glob("forward", "g")
        removed_inside.remove()
        run(m, zoo)
    snap = snapshot_dicts(m)
    assert_no_shims(snap)
    assert [k for k, _, _ in snap["2:_forward_pre_hooks"]] == [new.id]
    assert snap["2:_forward_pre_hooks"][0][2].__qualname__ == "hook_new"
    assert (
        snap["0:_forward_hooks"][0][0] == old.id and snap["0:_forward_hooks"][0][2].__qualname__ == "hook_old"
    )
    assert snap["1:_forward_hooks"] == []
    assert [k for k, _, _ in snap["_global_forward_hooks"]] == [g.id]
    for h in (old, new, g):
        h.remove()


def test_steps_threads_nesting_and_no_references_kept():
    m = model()
    zoo = Zoo()
    h = zoo.module(m[0], "forward", "f")
    seen_threads = []

    def worker():
        seen_threads.append(threading.get_ident())
        m(torch.randn(1, 4))

    with hooktrace.trace(m) as t:
        with pytest.raises(RuntimeError, match="already active"):
            with hooktrace.trace(m):
                pass
        run(m, zoo)
        t.mark_step()
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    h.remove()
    events = [e for e in t.trace.events if e.type == "hook"]
    assert [e.step for e in events] == [0, 1]
    assert events[1].thread == seen_threads[0] != events[0].thread
    assert t.trace.meta.steps == 2
    assert [e.seq for e in t.trace.events] == list(range(len(t.trace.events)))
    assert (
        t._capture._model is None
        and not t._capture._book.records
        and not t._capture._book.tensor_shims
        and not t._capture._rec.modules
    )


def test_factory_inside_capture_with_attach():
    zoo = Zoo()
    with hooktrace.trace() as t:
        m = model()
        h = zoo.module(m[1].fc, "forward_pre", "late_attach", prepend=True)
        t.attach(m)
        run(m, zoo)
    h.remove()
    check(zoo, t.trace)
    hook = t.trace.hook(h.id)
    assert (hook.module, hook.prepend_source) == ("1.fc", "registration")
    assert [mod.path for mod in t.trace.modules][:3] == ["", "0", "0.fc"]


def test_global_registration_hooks_phase_other():
    import torch.nn.modules.module as nn_module

    m = model()
    seen = []
    with hooktrace.trace(m) as t:
        handles = [
            nn_module.register_module_module_registration_hook(
                lambda mod, name, sub: seen.append(("module", name))
            ),
            nn_module.register_module_parameter_registration_hook(
                lambda mod, name, p: seen.append(("param", name))
            ),
            nn_module.register_module_buffer_registration_hook(
                lambda mod, name, b: seen.append(("buffer", name))
            ),
        ]
        m.extra = nn.Linear(2, 2)
        m.register_buffer("scale", torch.ones(1))
        for h in handles:
            h.remove()
    kinds = [(e.kind, e.phase, e.module) for e in t.trace.events if e.type == "hook"]
    assert [k for k, _, _ in kinds] == [
        "parameter_registration",
        "parameter_registration",
        "module_registration",
        "buffer_registration",
    ]
    assert [s[0] for s in seen] == ["param", "param", "module", "buffer"]
    assert {phase for _, phase, _ in kinds} == {"other"}
    assert all(t.trace.hook(h.id).scope == "global" for h in handles)


def test_trace_keeps_no_model_or_tensor_alive():
    import gc
    import weakref

    m = model()
    x = torch.randn(3, 4, requires_grad=True)
    with hooktrace.trace(m) as t:
        m[0].register_forward_hook(lambda mod, args, output, held=(m, x): None)  # a hook holding both
        out = m(x)
        out.register_hook(lambda g: None)
        out.sum().backward()
    # the trace is built when first used, from what the block left: that must hold no model or tensor
    refs = [weakref.ref(m), weakref.ref(x), weakref.ref(out)]
    del m, x, out
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    assert len(t.trace.events) > 0


def test_a_hook_taken_from_the_dict_during_the_block_is_the_users_and_adds_nothing_after():
    """The trace is built after the block, from the records the block made; the hook someone took out
    of a hook dict during the run is the user's own object, and calling it afterwards adds nothing."""
    m = model()
    zoo = Zoo()
    x = torch.randn(3, 4)
    with hooktrace.trace(m) as t:
        handle = zoo.module(m[2], "forward", "fwd")
        out = run(m, zoo, x)
        kept = m[2]._forward_hooks[handle.id]
        assert "hooktrace" not in kept.__qualname__ and not hasattr(kept, "__wrapped__")
    assert m[2]._forward_hooks[handle.id] is kept  # the very object, during and after the block
    assert_no_shims(snapshot_dicts(m))
    kept(m[2], (x,), out)  # the hook runs, as the user called it
    assert zoo.log == ["fwd", "fwd"]
    fired = [e for e in t.trace.events if e.type == "hook" and e.hook == handle.id]
    assert len(fired) == 1
    handle.remove()


def test_hook_registered_on_the_module_during_its_own_call_is_traced():
    m = model()
    zoo = Zoo()
    added: list = []

    def adds_to_itself(module, args):
        zoo.log.append("adds_to_itself")
        if not added:
            added.append(zoo.module(module, "forward", "same_call_fwd"))
            added.append(zoo.module(module, "backward", "same_call_bwd"))

    with hooktrace.trace(m) as t:
        h = m[0].register_forward_pre_hook(adds_to_itself)
        zoo.labels[h.id] = "adds_to_itself"
        run(m, zoo)
    h.remove()
    for handle in added:
        handle.remove()
    check(zoo, t.trace)
    assert zoo.log == ["adds_to_itself", "same_call_fwd"]


def test_register_function_kept_from_inside_a_capture_passes_through_afterwards():
    """`from torch.nn.modules.module import register_module_forward_hook` run inside the block binds
    hooktrace's patched function; called after the block it must just register, and a later capture
    must trace that hook like any other."""
    m = model()
    zoo = Zoo()
    with hooktrace.trace(m):
        from torch.nn.modules.module import register_module_forward_hook as kept

        kept_method = m[2].register_forward_pre_hook  # bound to the patched method
        kept_state = m[2].register_state_dict_pre_hook  # a kind wrapped the moment it is registered
    assert kept is not nn_module.register_module_forward_hook  # the patch, kept past the block
    handles = [kept(zoo.fn("kept_global")), kept_method(zoo.fn("kept_method"))]
    zoo.labels[handles[0].id], zoo.labels[handles[1].id] = "kept_global", "kept_method"
    state_hook = zoo.fn("kept_state")
    handles.append(kept_state(state_hook))
    assert list(m[2]._state_dict_pre_hooks.values()) == [state_hook]  # the hook itself, no shim
    assert_no_shims(snapshot_dicts(m))
    try:
        run(m, zoo)
        assert zoo.log.count("kept_global") == len(list(m.modules())) and zoo.log.count("kept_method") == 1
        zoo.log.clear()
        before = snapshot_dicts(m)
        with hooktrace.trace(m) as t:
            run(m, zoo)
        check(zoo, t.trace)
        assert snapshot_dicts(m) == before
        assert t.trace.hook(handles[0].id).registered_at is None  # registered before this capture
    finally:
        for handle in handles:
            handle.remove()
