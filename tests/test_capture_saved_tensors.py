"""Saved-tensor hooks traced are what they are untraced: what a saved tensor says its hooks are, and
how long the hooks and what they hold live.

hooktrace pushes recording shims of a `saved_tensors_hooks` object's pack/unpack hooks. Code that
reads them back from a saved tensor (`grad_fn._raw_saved_self.unpack_hook`) must get the user's
function, and the shims must not keep the hooks, their closures or checkpoint's graph alive after the
object is gone: leak checks (a weak reference that must die without a collection) see the same as
untraced.
"""

from __future__ import annotations

import gc
import weakref
from contextlib import nullcontext
from typing import Any, Callable

import pytest
import torch
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.checkpoint import checkpoint

import hooktrace

from .training_hooks import Log, no_gc


def _block(traced: bool) -> Any:
    return hooktrace.trace() if traced else nullcontext()


@pytest.mark.skipif(
    not hasattr(torch._C._autograd.SavedTensor, "unpack_hook"),
    reason="torch 2.8 and 2.9's SavedTensor has no unpack_hook or data to read back (torch 2.10 added them)",
)
@pytest.mark.parametrize("traced", [False, True])
def test_a_saved_tensor_reports_the_users_unpack_hook(traced: bool) -> None:
    L = Log()
    pack, unpack = L.fn("pack", returns=lambda x: x), L.fn("unpack", returns=lambda x: x)
    with _block(traced) as t:
        a = torch.tensor(2.0, requires_grad=True)
        with saved_tensors_hooks(pack, unpack):
            b = a**2
        saved = b.grad_fn._raw_saved_self
        assert saved.unpack_hook is unpack
        assert saved.data is a  # what pack returned, as untraced
        plain = (b.exp() ** 2).grad_fn._raw_saved_self
        assert plain.unpack_hook is None  # no hooks were pushed for it
        b.backward()
    assert L.log == ["pack", "unpack"] and a.grad.item() == 4.0
    if traced:
        assert L.traced(t.trace) == L.log  # still traced


@pytest.mark.parametrize("traced", [False, True])
def test_hooks_of_a_saved_tensors_object_die_with_it(traced: bool) -> None:
    def scope() -> tuple[Callable[[], Any], Callable[[], Any]]:
        held = torch.ones(1)

        def unpack(x: torch.Tensor) -> torch.Tensor:
            return x + 0 * held

        ctx = saved_tensors_hooks(lambda x: x, unpack)
        x = torch.randn(3, requires_grad=True)
        with ctx:
            y = x.sin()
        y.sum().backward()  # the graph, and the saved tensor holding the hooks, are gone after this
        return weakref.ref(unpack), weakref.ref(held)

    with _block(traced), no_gc():
        unpack_ref, held_ref = scope()
        assert unpack_ref() is None and held_ref() is None


@pytest.mark.parametrize("traced", [False, True])
def test_an_object_entered_twice_keeps_one_pair_of_ids_while_alive(traced: bool) -> None:
    L = Log()
    with _block(traced) as t:
        ctx = saved_tensors_hooks(L.fn("pack", returns=lambda x: x), L.fn("unpack", returns=lambda x: x))
        x = torch.randn(2, requires_grad=True)
        with ctx:
            y = x.exp()
        with ctx:
            y = y.exp()
        y.sum().backward()
    assert L.log == ["pack", "pack", "unpack", "unpack"]
    if traced:
        assert L.traced(t.trace) == L.log
        assert sorted(h.kind for h in t.trace.hooks if h.name.startswith("hook_")) == ["pack", "unpack"]


@pytest.mark.parametrize("traced", [False, True])
def test_a_nested_checkpoints_graph_dies_when_its_output_does(traced: bool) -> None:
    class Tag:
        pass

    def inner(x: torch.Tensor) -> torch.Tensor:
        return x.sin().exp().sin()

    def outer(x: torch.Tensor) -> torch.Tensor:
        return checkpoint(inner, x, use_reentrant=False)

    def scope() -> list[Any]:
        a = torch.randn((), requires_grad=True)
        with torch.enable_grad():  # the gradient of a checkpointed function, as a graph of its own
            out = checkpoint(outer, a, use_reentrant=False)
            (grad,) = torch.autograd.grad(out, (a,), create_graph=True)
        refs = []
        todo, seen = [grad.grad_fn], set()
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            tag = Tag()
            node.metadata["tag"] = tag  # lives exactly as long as the node
            refs.append(weakref.ref(tag))
            todo.extend(fn for fn, _ in node.next_functions)
        return refs

    with _block(traced):
        refs = scope()
        gc.collect()  # checkpoint's graph holds a cycle of its own, untraced too
        assert refs and [r for r in refs if r() is not None] == []
