"""The capture ledger (hooktrace/capture/ledger.py): every patch a capture makes is undone, the last
first, and after any session every attribute it touched is the very object it was before — after a
normal block, after an exception inside it, with a nested session refused, with sessions one after
another, and under `exec`'s registration watch and step watch."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch
import torch.autograd.function as autograd_function
import torch.nn as nn
import torch.nn.modules.module as nn_module
import torch.optim.optimizer as optim_module
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.checkpoint import checkpoint
from torch.utils.hooks import RemovableHandle

import hooktrace
from hooktrace.capture.ledger import _ABSENT, CURRENT, Ledger
from hooktrace.capture.session import TraceSession
from hooktrace.capture.steps import Registrations, StepWatch, open_after


# -- the ledger alone -----------------------------------------------------------------------------
class _Owner:
    pass


def test_restore_undoes_the_last_patch_first_and_deletes_what_was_absent() -> None:
    owner = _Owner()
    owner.a = "a0"
    ledger = Ledger()
    ledger.set(owner, "a", "a1")
    ledger.set(owner, "a", "a2")  # a patch over a patch: undone in reverse, back to a0
    ledger.set(owner, "b", "b1")  # absent before: deleted again
    space = {"k": "k0"}
    ledger.set_item(space, "k", "k1")
    ledger.set_item(space, "new", 1)
    assert (owner.a, owner.b, space) == ("a2", "b1", {"k": "k1", "new": 1})
    ledger.restore()
    assert owner.a == "a0" and not hasattr(owner, "b") and space == {"k": "k0"} and len(ledger) == 0


def test_a_class_attribute_is_restored_as_it_stood_in_the_class() -> None:
    class Base:
        @staticmethod
        def f() -> str:
            return "base"

    class Child(Base):
        pass

    own = vars(Base)["f"]
    ledger = Ledger()
    ledger.set(Base, "f", staticmethod(lambda: "patched"))
    ledger.set(Child, "f", staticmethod(lambda: "child"))  # inherited before: deleted on restore
    assert Child.f() == "child"
    ledger.restore()
    assert vars(Base)["f"] is own and "f" not in vars(Child) and Child.f() == "base"


def test_mark_restores_part_and_undo_actions_run_in_their_place() -> None:
    owner = _Owner()
    owner.x = owner.y = 0
    seen: list[Any] = []
    ledger = Ledger()
    ledger.set(owner, "x", 1)
    mark = ledger.mark()
    ledger.on_restore(lambda: seen.append(("undo", owner.y)))
    ledger.set(owner, "y", 1)
    ledger.restore(to=mark)
    assert (owner.x, owner.y, seen) == (1, 0, [("undo", 0)])  # the undo ran after y was put back
    ledger.restore()
    assert owner.x == 0


def test_an_undo_that_raises_does_not_stop_the_others() -> None:
    owner = _Owner()
    owner.x = owner.y = 0
    ledger = Ledger()
    ledger.set(owner, "x", 1)
    ledger.on_restore(lambda: 1 / 0)
    ledger.set(owner, "y", 1)
    with pytest.raises(ZeroDivisionError):
        ledger.restore()
    assert (owner.x, owner.y, len(ledger)) == (0, 0, 0)


def test_claim_refuses_a_place_another_capture_holds() -> None:
    first, second = Ledger(), Ledger()
    first.claim("viewer", object(), "views")
    try:
        with pytest.raises(RuntimeError, match="another capture's views are installed"):
            second.claim("viewer", object(), "views")
    finally:
        first.restore()
    assert CURRENT.viewer is None


# -- real sessions: every patched attribute is the same object after -----------------------------
def _owners() -> list[Any]:
    """Everything the capture may patch: torch's classes and modules, every optimizer class, and
    the capture's own slots."""
    optimizers, todo = [], [torch.optim.Optimizer]
    while todo:
        cls = todo.pop()
        if cls not in optimizers:
            optimizers.append(cls)
            todo.extend(cls.__subclasses__())
    owners: list[Any] = [nn.Module, torch.Tensor, *optimizers, nn_module, torch.nn.modules, torch.nn]
    owners += [optim_module, torch.optim, RemovableHandle, autograd_function._HookMixin, saved_tensors_hooks]
    owners += [
        torch._C._autograd.SavedTensor,
        torch.autograd,
        torch.autograd.Variable,
        torch.autograd.profiler,
    ]
    if torch.distributed.is_available():
        owners.append(torch.distributed)
    fsdp = ("torch.distributed.fsdp._fully_shard._fsdp_param_group", "torch.distributed.fsdp._runtime_utils")
    if all(name in sys.modules for name in fsdp):  # FSDP's comm-hook callers (capture/fsdp.py)
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

        owners += [sys.modules[name] for name in fsdp] + [FSDPModule, FullyShardedDataParallel]
    if "torch._dynamo" in sys.modules:  # compiled autograd's end_capture (capture/compiled.py)
        from torch._dynamo import compiled_autograd, output_graph, symbolic_convert

        owners.append(compiled_autograd.AutogradCompilerInstance)
        # the hooks Dynamo inlines into a forward graph (capture/compiled.py, Forward)
        owners += [symbolic_convert.InliningInstructionTranslator, output_graph.OutputGraph]
        owners.append(sys.modules["torch._dynamo.variables.nn_module"])  # its unpatched_nn_module_call
    return owners


def _state(extra_functions: tuple[Any, ...] = ()) -> dict[tuple[int, str], Any]:
    """(owner, name) -> the object there, for every attribute of every owner; and the `__code__` of
    every function among them (the optimizers' step wrappers) and of `extra_functions`."""
    state: dict[tuple[int, str], Any] = {}
    functions = list(extra_functions)
    for owner in _owners():
        for name, value in list(vars(owner).items()):
            state[id(owner), name] = value
            # type(), not isinstance(): no __class__ read (torch's deprecated names warn on it)
            if type(value) in (staticmethod, classmethod):
                value = value.__func__
            if type(value) is types.FunctionType:
                functions.append(value)
    # torch's own counter of handle ids: every registration moves it
    state.pop((id(RemovableHandle), "next_id"))
    for name in ("_cupti_monitor_module", "_cupti_monitor_checked"):  # the profiler's lazy cache
        state.pop((id(torch.autograd.profiler), name), None)
    for slot in CURRENT.__slots__:
        state[id(CURRENT), slot] = getattr(CURRENT, slot)
    for fn in functions:
        state[id(fn), "__code__"] = fn.__code__
    return state


def _assert_same(before: dict[tuple[int, str], Any], extra_functions: tuple[Any, ...] = ()) -> None:
    after = _state(extra_functions)
    changed = [key for key, value in before.items() if key not in after or after[key] is not value]
    assert not changed, f"not restored: {[name for _, name in changed]}"
    # what appeared meanwhile (torch's lazy imports) is none of hooktrace's
    for key in after.keys() - before.keys():
        module = getattr(after[key], "__module__", None) or ""
        assert not module.startswith("hooktrace"), key[1]


def _covered(ledger: Ledger, before: dict[tuple[int, str], Any]) -> None:
    """Every patch in `ledger` is one the snapshot sees (so the comparison after it is no formality)."""
    patched = ledger.patched()
    assert patched
    namespaces = [o for o, _, _ in patched if isinstance(o, dict)]
    for owner, name, original in patched:
        if not isinstance(owner, dict):
            # a name the capture adds (FSDP1's copies read `_hooktrace_fsdp_comm`) must be gone after:
            # `_assert_same` finds anything of hooktrace's that appeared
            assert (id(owner), name) in before or (name.startswith("_hooktrace_") and original is _ABSENT), (
                owner,
                name,
            )
        elif owner is vars(nn_module):  # what a dunder's copy reads there (views._swap_dunder)
            assert name.startswith("_hooktrace_") and original is _ABSENT, name
    # beside PyTorch's module, only the copies' namespace, hooktrace's own
    assert len({id(o) for o in namespaces if o is not vars(nn_module)}) <= 1


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def _train_step(m: nn.Module, opt: torch.optim.Optimizer) -> None:
    x = torch.randn(3, 4, requires_grad=True)
    with saved_tensors_hooks(lambda t: t, lambda t: t):
        y = checkpoint(m, x, use_reentrant=False)
    y.grad_fn.register_hook(lambda gi, go: None)
    y.sum().backward()
    opt.step()
    opt.zero_grad()


def test_every_patch_of_a_session_is_undone() -> None:
    import torch._dynamo  # noqa: F401 - so the compiled-autograd patch is made and checked too

    m = _model()
    opt = torch.optim.AdamW(m.parameters())
    before = _state()
    with hooktrace.trace(m) as t:
        ledger = t._capture._ledger
        _covered(ledger, before)
        assert len(ledger.patched()) >= 40  # the register_* functions, the copies, autograd's, ...
        m[0].register_forward_hook(lambda mod, args, out: None)
        _train_step(m, opt)
    assert len(ledger) == 0
    _assert_same(before)
    assert any(e.kind == "pack" for e in t.trace.hook_events())


def test_after_an_exception_inside_the_block() -> None:
    m = _model()
    opt = torch.optim.SGD(m.parameters())
    before = _state()

    def boom(mod: Any, args: Any) -> None:
        raise KeyError("boom")

    h = m[2].register_forward_pre_hook(boom)
    with pytest.raises(KeyError, match="boom"):
        with hooktrace.trace(m):
            _train_step(m, opt)
    h.remove()
    _assert_same(before)


def test_a_nested_session_is_refused_and_both_leave_nothing() -> None:
    m = _model()
    before = _state()
    with hooktrace.trace(m) as outer:
        inner = hooktrace.trace(m)
        with pytest.raises(RuntimeError, match="already active"):
            with inner:
                pass
        assert CURRENT.session is outer._capture  # the refused one took nothing from the open one
        m(torch.randn(2, 4)).sum().backward()
    _assert_same(before)
    assert len(outer.trace.events) > 0


def test_sessions_one_after_another() -> None:
    m = _model()
    opt = torch.optim.Adam(m.parameters())
    before = _state()
    traces = []
    for _ in range(3):
        with hooktrace.trace(m) as t:
            _train_step(m, opt)
        _assert_same(before)
        traces.append(t.trace)
    assert len({len(tr.events) for tr in traces}) == 1


def test_module_setattr_stays_pytorchs_object_and_its_registration_hooks_are_traced() -> None:
    """`nn.Module.__setattr__` gets the copy's code, not a new function (a dunder set on the class
    would update every subclass's slot): identity and type lookups find PyTorch's own inside the
    block, its registration hooks are traced, and its code is PyTorch's again after."""
    own = vars(nn.Module)["__setattr__"]
    own_code = own.__code__
    names_before = set(vars(nn_module))
    seen: list[str] = []

    def on_module(module: nn.Module, name: str, submodule: nn.Module) -> None:
        seen.append(name)

    m = _model()
    handle = nn_module.register_module_module_registration_hook(on_module)
    try:
        with hooktrace.trace(m) as t:
            assert vars(nn.Module)["__setattr__"] is own and nn.Module.__setattr__ is own
            assert own.__code__ is not own_code  # the copy's, reading the global hooks through views
            m.extra = nn.Linear(2, 2)  # Module.__setattr__ -> the global module registration hook
    finally:
        handle.remove()
    assert seen == ["extra"]
    assert own.__code__ is own_code and vars(nn.Module)["__setattr__"] is own
    assert set(vars(nn_module)) == names_before
    fired = [t.trace.hook(e.hook) for e in t.trace.hook_events() if e.kind == "module_registration"]
    assert [(h.name.rsplit(".", 1)[-1], h.scope) for h in fired] == [("on_module", "global")]


def test_a_session_that_fails_to_install_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from hooktrace.capture import autograd

    def fail(callbacks: Any, ledger: Ledger) -> None:
        ledger.set(torch.autograd, "backward", None)  # a patch made before the failure is undone too
        raise OSError("installing failed")

    monkeypatch.setattr(autograd, "install", fail)
    before = _state()
    with pytest.raises(OSError, match="installing failed"):
        with hooktrace.trace(_model()):
            pass
    monkeypatch.undo()
    _assert_same(before)


@pytest.mark.parametrize("step_on", ["optimizer", "backward", "forward"])
def test_exec_watches_and_a_window_leave_nothing(step_on: str) -> None:
    """What `hooktrace exec` installs: the registration watch, the step watch, a session opened after
    them (and the step watch counting around the session's `__call__`), closed in the same order."""
    m = _model()
    opt = torch.optim.SGD(m.parameters())
    before = _state()
    ended: list[int] = []
    registrations = Registrations()
    watch = StepWatch(step_on, lambda: ended.append(1))
    registrations.install()
    watch.install()
    m[0].register_forward_hook(lambda mod, args, out: None)  # seen by the watch, before the window
    _train_step(m, opt)
    session = TraceSession(None)
    open_after(registrations, session)
    watch.rewrap()
    _train_step(m, opt)
    session.__exit__(None, None, None)
    watch.rewrap()
    _train_step(m, opt)
    watch.restore()
    registrations.restore()
    _assert_same(before)
    assert ended and session.trace.hook_events()


def test_ddp_comm_hook_code_is_its_own_after(gloo_one_rank: None) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(_model())

    def allreduce(state, bucket):  # no annotations: DDP accepts only dist.GradBucket for `bucket`
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    code = allreduce.__code__
    before = _state((allreduce,))
    with hooktrace.trace(ddp) as t:
        ddp.register_comm_hook(None, allreduce)
        ddp(torch.randn(3, 4)).sum().backward()
        assert allreduce.__code__ is not code  # traced through its code for the block
        _covered(t._capture._ledger, {**before, (id(allreduce), "__code__"): code})
    assert allreduce.__code__ is code
    _assert_same(before, (allreduce,))
    assert any(e.kind == "comm" for e in t.trace.hook_events())
