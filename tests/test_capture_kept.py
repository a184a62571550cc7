"""What the process keeps between sessions for unchanged forward hooks (capture/kept.py, issue 34).

A later session over the same dicts takes the records and shims the first one made; the trace it
gives is the one a session without them gives, and nothing it keeps holds a hook, a module or a
dict alive once the session is over.
"""

from __future__ import annotations

import copy
import gc
import weakref
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.capture import kept
from hooktrace.capture.ledger import CURRENT

from .training_hooks import no_gc


def _model() -> tuple[nn.Module, list[str]]:
    log: list[str] = []
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))

    def pre(module: Any, args: Any) -> None:
        log.append("pre")

    def fwd(module: Any, args: Any, output: Any) -> None:
        log.append("fwd")

    model[0].register_forward_pre_hook(pre)
    model[0].register_forward_hook(fwd)
    model[2].register_forward_hook(fwd)
    return model, log


def _facts(session: Any) -> tuple[list, list]:
    trace = session.trace
    hooks = [(h.id, h.kind, h.scope, h.module, h.name, h.defined_at, h.prepend) for h in trace.hooks]
    events = [(e.type, e.hook, e.module, e.kind, e.phase) for e in trace.events]
    return hooks, events


def _shims(model: nn.Module) -> list[Any]:
    """The shims the open session's views give for the model's forward hooks."""
    book = CURRENT.session._book
    return [
        shim
        for m in model.modules()
        for d in (m._forward_pre_hooks, m._forward_hooks)
        if d
        for shim in book.view(d, m, "_forward_hooks").values()
    ]


def test_a_later_session_takes_the_kept_shims_and_gives_the_same_trace() -> None:
    model, log = _model()
    x = torch.randn(2, 3)
    facts, shims, wrapped = [], [], []
    for _ in range(3):
        with hooktrace.trace(model) as session:
            shims.append(_shims(model))
            wrapped.append([s.__wrapped__ for s in shims[-1]])  # each shim stands for its hook
            model(x).sum().backward()
        facts.append(_facts(session))
    assert facts[0] == facts[1] == facts[2]
    held = [h for m in model.modules() for d in (m._forward_pre_hooks, m._forward_hooks) for h in d.values()]
    assert wrapped == [held] * 3
    assert not any(hasattr(s, "__wrapped__") for s in shims[2])  # after the block: no strong reference
    assert all(a is b for a, b in zip(shims[1], shims[2]))  # the very shims: nothing made again
    assert log == ["pre", "fwd", "fwd"] * 3
    spaces = [namespace for shapes in (False, True) for namespace, _ in kept._spaces(shapes).values()]
    assert all(namespace["append"] is kept._drop for namespace in spaces)  # the session's lists let go


def test_a_dict_that_changed_between_sessions_is_traced_as_it_is_now() -> None:
    model, log = _model()
    x = torch.randn(2, 3)
    with hooktrace.trace(model):
        model(x)
    added = model[0].register_forward_hook(lambda m, a, o: log.append("added"), prepend=True)
    with hooktrace.trace(model) as session:
        model(x)
    hooks, events = _facts(session)
    fired = [hid for kind, hid, *_ in events if kind == "hook"]
    assert fired[:3] == [h[0] for h in hooks[:3]] and fired[1] == added.id  # the order they ran in
    assert log[-4:] == ["pre", "added", "fwd", "fwd"]
    assert [h[6] for h in hooks if h[0] == added.id] == [True]  # prepended
    added.remove()
    with hooktrace.trace(model) as session:
        model(x)
    assert added.id not in [h[0] for h in _facts(session)[0]]


def test_a_hook_renamed_between_sessions_has_its_new_name() -> None:
    model, _ = _model()
    x = torch.randn(2, 3)
    with hooktrace.trace(model) as first:
        model(x)
    hook = next(iter(model[2]._forward_hooks.values()))
    hook.__qualname__ = "renamed_hook"
    try:
        with hooktrace.trace(model) as second:
            model(x)
        names = {h.name for h in second.trace.hooks}
        assert "renamed_hook" in names and {h.name for h in first.trace.hooks} != names
    finally:
        hook.__qualname__ = "_model.<locals>.fwd"


def test_what_is_kept_holds_no_hook_module_or_dict() -> None:
    model, _ = _model()
    x = torch.randn(2, 3)

    def extra(module: Any, args: Any, output: Any) -> None:
        return None

    handle = model[2].register_forward_hook(extra)
    with hooktrace.trace(model):
        model(x)
    with hooktrace.trace(model):
        model(x)
    before = kept.kept_count()
    assert before >= 3
    hook_ref = weakref.ref(extra)
    handle.remove()
    del extra
    gc.collect()
    assert hook_ref() is None  # the kept shim held it by a weak proxy only
    refs = [weakref.ref(model), weakref.ref(model[0]), weakref.ref(model[0]._forward_hooks)]
    with no_gc():
        del model
        assert [r() for r in refs] == [None, None, None]  # freed by reference counting, as untraced
    assert kept.kept_count() <= before - 3  # their entries went with them


def test_a_kept_shim_after_its_session_still_calls_a_live_hook_and_records_nothing() -> None:
    model, log = _model()
    x = torch.randn(2, 3)
    with hooktrace.trace(model) as session:
        shims = _shims(model)
        model(x)
    n = len(session.trace.events)
    shims[0](model[0], (x,))  # as a view read mid-call on another thread would, after the end
    assert log[-1] == "pre" and len(session.trace.events) == n


def _many(shallow_copy: bool = True) -> tuple[nn.Sequential, list[str]]:
    """Six Linear modules with forward hooks (a run of kept dicts), the fourth a shallow copy of the
    third (the same dicts twice, with another owner: its calls run the same hooks), one hook a closure."""
    log: list[str] = []

    def pre(module: Any, args: Any) -> None:
        log.append(f"pre {module.out_features}")

    def fwd(module: Any, args: Any, output: Any) -> None:
        log.append(f"fwd {module.out_features}")

    layers = [nn.Linear(4, 4) for _ in range(3)]
    for layer in layers:
        layer.register_forward_pre_hook(pre)
        layer.register_forward_hook(fwd)
    tag = "closure"
    layers[1].register_forward_hook(lambda m, a, o: log.append(tag))
    layers.append(copy.copy(layers[2]) if shallow_copy else nn.Linear(4, 4))
    layers += [nn.Linear(4, 4), nn.Linear(4, 4)]
    layers[4].register_forward_hook(fwd)
    layers[5].register_forward_pre_hook(pre)
    return nn.Sequential(*layers), log


@pytest.mark.parametrize("shallow_copy", [False, True])
def test_kept_dicts_taken_together_give_the_first_sessions_trace(shallow_copy: bool) -> None:
    model, log = _many(shallow_copy)
    x = torch.randn(2, 4)
    facts = []
    for _ in range(3):
        with hooktrace.trace(model) as session:
            model(x)
        facts.append(_facts(session))
    assert facts[0] == facts[1] == facts[2]
    hooks, events = facts[0]
    assert len(hooks) == 9 and "_many.<locals>.<lambda>" in [h[4] for h in hooks]
    fired = [(hid, module) for kind, hid, module, *_ in events if kind == "hook"]
    by_two, by_copy = [h for h, m in fired if m == "2"], [h for h, m in fired if m == "3"]
    assert len(by_two) == 2 and (by_copy == by_two if shallow_copy else not by_copy)  # a copy runs the same
    assert len(log) == len(fired) * 3 == (33 if shallow_copy else 27)


@pytest.mark.parametrize("shallow_copy", [False, True])
def test_one_dict_changed_among_kept_ones_is_traced_as_it_is_now(shallow_copy: bool) -> None:
    model, log = _many(shallow_copy)
    x = torch.randn(2, 4)
    with hooktrace.trace(model):
        model(x)
    added = model[5].register_forward_pre_hook(lambda m, a: log.append("added"))  # the last kept dict
    first = []
    for _ in range(2):
        with hooktrace.trace(model) as session:
            model(x)
        first.append(_facts(session))
    assert first[0] == first[1]
    assert added.id in [h[0] for h in first[0][0]] and added.id in [e[1] for e in first[0][1]]
    assert log.count("added") == 2


def _first_hook(module: Any, args: Any, output: Any) -> None:
    return None


def _second_hook(module: Any, args: Any, output: Any) -> None:
    return None


def _wrapping(inner: Any) -> Any:
    def wrapper(module: Any, args: Any, output: Any) -> None:
        return inner(module, args, output)

    return wrapper


@pytest.mark.parametrize("shallow_copy", [False, True])
def test_a_closure_among_kept_dicts_is_named_after_what_it_holds_now(shallow_copy: bool) -> None:
    model, _ = _many(shallow_copy)
    x = torch.randn(2, 4)
    wrapper = _wrapping(_first_hook)
    model[0].register_forward_hook(wrapper)
    names = []
    for fn in (_first_hook, _second_hook, _second_hook):
        wrapper.__closure__[0].cell_contents = fn  # what the closure holds changes between sessions
        with hooktrace.trace(model) as session:
            model(x)
        names.append([h[4] for h in _facts(session)[0] if h[4].startswith("wrapper")])
    assert names == [["wrapper → _first_hook"]] + [["wrapper → _second_hook"]] * 2
