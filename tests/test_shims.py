"""The shim on its own: calling conventions, pass-through of results and errors, what it records."""

from __future__ import annotations

import threading

import pytest
import torch

import hooktrace
from hooktrace.capture import shims


@pytest.mark.parametrize("kind", sorted(shims.POSITIONAL_KINDS) + ["state_dict", "load_state_dict_pre"])
@pytest.mark.parametrize("nargs", [1, 2, 3, 4, 5, 7])
def test_shim_passes_any_positional_call_through(kind: str, nargs: int) -> None:
    seen = []

    def hook(*args: object) -> object:
        seen.append(args)
        return ("result", len(args))

    rec = shims.Recorder()
    shim = shims.make_shim(rec, hook, 7, kind, None, True)
    args = tuple(object() for _ in range(nargs))
    assert shim(*args) == ("result", nargs)
    assert seen == [args]
    (record,) = rec.hooks
    seq, hook_id, tid, t0, t1, outcome, module = record
    returned = kind not in shims.RETURN_IGNORED  # a new object, which PyTorch uses for most kinds
    assert (seq, hook_id, tid, outcome, module) == (0, 7, threading.get_ident(), returned, id(args[0]))
    assert t1 >= t0


def test_returned_is_false_when_the_hook_hands_back_what_it_was_given() -> None:
    """docs/format.md `returned`: something other than what PyTorch passed; the very object is no replacement."""
    lin = torch.nn.Linear(2, 2)
    lin.register_forward_pre_hook(lambda m, args: args)
    lin.register_forward_pre_hook(lambda m, args: args[0])  # PyTorch wraps it: (x,) again
    lin.register_forward_pre_hook(lambda m, args, kwargs: (args, kwargs), with_kwargs=True)
    lin.register_forward_hook(lambda m, args, out: out)
    lin.register_full_backward_hook(lambda m, gin, gout: gin)
    lin.weight.register_hook(lambda g: g)
    lin.register_forward_hook(lambda m, args, out: out * 1)  # a new tensor: replaced
    lin.bias.register_hook(lambda g: g.clone())  # replaced
    x = torch.randn(1, 2, requires_grad=True)
    with hooktrace.trace(lin) as t:
        lin(x).sum().backward()
    returned = {e.hook: e.returned for e in t.trace.events if e.type == "hook"}
    kinds = {h.id: h.kind for h in t.trace.hooks}
    assert len(returned) == 8
    assert sorted(kinds[hid] for hid, r in returned.items() if r) == ["forward", "grad"]


def test_generic_shim_passes_keywords_through() -> None:
    rec = shims.Recorder()
    owner = torch.nn.Linear(1, 1)
    shim = shims.make_shim(rec, lambda *a, **k: (a, k), 1, "state_dict", owner, False)
    assert shim(1, x=2) == ((1,), {"x": 2})
    assert rec.hooks[0][5:] == (True, id(owner))


def test_shim_records_and_reraises_the_hooks_error() -> None:
    class Boom(Exception):
        pass

    def hook(grad: object) -> None:
        raise Boom("no")

    rec = shims.Recorder()
    shim = shims.make_shim(rec, hook, 3, "grad", None, False)
    with pytest.raises(Boom) as info:
        shim(object())
    assert info.value.__traceback__ is not None
    assert rec.hooks[0][5] == "Boom: no"
    assert rec.hooks[0][6] is None  # a tensor hook's first argument is the gradient, not a module


def test_records_hold_no_objects_the_garbage_collector_must_walk() -> None:
    """Records are ints, strings, bools and None: untracked after one collection, however many."""
    import gc

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    model[0].register_forward_hook(lambda m, a, o: None)
    with hooktrace.trace(model) as t:
        model(torch.randn(1, 2)).sum().backward()
        rec = t._capture._rec
        gc.collect()
        records = rec.hooks + rec.calls
        assert records and not any(gc.is_tracked(r) for r in records)
        assert (
            {id(r()) for r in rec.modules} == set(rec.module_ids) == {id(model), id(model[0]), id(model[1])}
        )
        # one int object per module id, shared by its records (memory per event)
        named = [r[6] for r in rec.hooks] + [r[3] for r in rec.calls]
        assert named and all(key is rec.module_ids[key] for key in named)


def test_a_hook_taken_from_its_dict_and_called_by_hand_is_the_users_own() -> None:
    """The dicts hold what was registered (transparency): a hook a library takes out of the dict and
    calls itself is the user's function, so that call is not a PyTorch firing and is not traced."""
    lin = torch.nn.Linear(2, 2)
    calls = []

    def fwd(m: object, a: object, o: object) -> None:
        calls.append("fwd")

    lin.register_forward_hook(fwd)
    x = torch.randn(1, 2)
    with hooktrace.trace(lin) as t:
        out = lin(x)
        for hook in list(lin._forward_hooks.values()):
            assert hook is fwd
            hook(lin, (x,), out)  # as some libraries do
    assert calls == ["fwd", "fwd"]
    assert [e.type for e in t.trace.events] == ["enter", "hook", "exit"]
    assert [(e.phase, e.module) for e in t.trace.events if e.type == "hook"] == [("forward", "")]


def test_tensor_hooks_registered_inside_forward_hooks_are_named_after_the_module() -> None:
    """The shim's frame tells which module's input or output a tensor hook went on."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())

    def on_input(module: object, args: tuple) -> None:
        args[0].register_hook(lambda g: None)

    def on_output(module: object, args: tuple, output: torch.Tensor) -> None:
        output.register_hook(lambda g: None)

    model[1].register_forward_pre_hook(on_input)
    model[1].register_forward_hook(on_output)
    with hooktrace.trace(model) as t:
        model(torch.randn(3, 2, requires_grad=True)).sum().backward()
    tensors = sorted(h.tensor for h in t.trace.hooks if h.scope == "tensor")
    assert tensors == ["input of 1", "output of 1"]


def test_shims_of_hooks_held_at_the_start_are_made_when_the_block_opens(monkeypatch) -> None:
    """The first traced step makes no shim for hooks registered before the block (it costs what the
    tenth does); a hook registered inside the block gets its shim at first read, and both fire."""
    made: list[int] = []
    real = shims.make_shim

    def counting(rec, fn, hook_id, *rest):  # noqa: ANN001, ANN002
        made.append(hook_id)
        return real(rec, fn, hook_id, *rest)

    monkeypatch.setattr(shims, "make_shim", counting)
    fired: list[str] = []
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    before = model[0].register_forward_hook(lambda m, a, o: fired.append("before"))
    with hooktrace.trace(model) as t:
        at_open = list(made)
        model(torch.randn(1, 2))
        assert made == at_open == [before.id]
        inside = model[1].register_forward_pre_hook(lambda m, a: fired.append("inside"))
        model(torch.randn(1, 2))
        assert made == [before.id, inside.id]
    assert fired == ["before", "before", "inside"]  # the second call: Linear's hook, then ReLU's pre-hook
    order = [e.hook for e in t.trace.events if e.type == "hook"]
    assert order == [before.id, before.id, inside.id]
