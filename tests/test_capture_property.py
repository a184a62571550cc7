"""Property: any sequence of registrations and removals traces in PyTorch's own order, and is restored."""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hooktrace
from tests.oracle import Zoo, assert_no_shims, snapshot_dicts

MODULE_KINDS = ("forward_pre", "forward", "backward_pre", "backward")
GLOBAL_KINDS = ("forward_pre", "forward", "backward_pre", "backward")

registration = st.one_of(
    st.tuples(
        st.just("module"),
        st.sampled_from(MODULE_KINDS),
        st.integers(0, 3),
        st.booleans(),
        st.booleans(),
        st.booleans(),
    ),
    st.tuples(
        st.just("global"),
        st.sampled_from(GLOBAL_KINDS),
        st.just(0),
        st.just(False),
        st.booleans(),
        st.booleans(),
    ),
    st.tuples(
        st.just("tensor"),
        st.sampled_from(("grad", "post_accumulate_grad")),
        st.integers(0, 1),
        st.just(False),
        st.just(False),
        st.just(False),
    ),
    st.tuples(
        st.just("remove"), st.just(""), st.integers(0, 50), st.just(False), st.just(False), st.just(False)
    ),
)


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), nn.Sequential(nn.Linear(3, 3), nn.Tanh()), nn.Linear(3, 1))


def apply(zoo: Zoo, modules: list[nn.Module], params: list[torch.Tensor], ops: list, handles: list) -> None:
    for n, (scope, kind, target, prepend, with_kwargs, always_call) in enumerate(ops):
        label = f"{scope}{n}_{kind}"
        if scope == "remove":
            if handles:
                handles.pop(target % len(handles)).remove()
            continue
        if scope == "tensor":
            handles.append(zoo.tensor(params[target], kind, label))
            continue
        flags = {}
        if scope == "module" and prepend:
            flags["prepend"] = True
        if with_kwargs and (kind == "forward" or kind == "forward_pre" and scope == "module"):
            flags["with_kwargs"] = True
        if kind == "forward" and always_call:
            flags["always_call"] = True
        if scope == "module":
            handles.append(zoo.module(modules[target], kind, label, **flags))
        else:
            handles.append(zoo.glob(kind, label, **flags))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=st.lists(registration, max_size=6), inside=st.lists(registration, max_size=6))
def test_random_registrations_trace_in_pytorch_order_and_restore(before, inside):
    m = build()
    modules = [m, m[0], m[1], m[1][0]]
    params = [m[0].weight, m[2].bias]
    zoo = Zoo()
    handles: list = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            apply(zoo, modules, params, before, handles)
            snap_before = snapshot_dicts(m)
            with hooktrace.trace(m) as t:
                apply(zoo, modules, params, inside, handles)
                snap_inside = snapshot_dicts(m, see_through=True)
                m(torch.randn(2, 3, requires_grad=True)).sum().backward()
            snap_after = snapshot_dicts(m)
        assert zoo.traced(t.trace) == zoo.log
        assert_no_shims(snap_after)
        if not inside:
            assert snap_after == snap_before
        assert [[(k, i) for k, i, _ in v] for v in snap_after.values()] == [
            [(k, i) for k, i, _ in v] for v in snap_inside.values()
        ]
        for hid, expected in zoo.expected.items():
            hook = next((h for h in t.trace.hooks if h.id == hid), None)
            if hook is None:
                continue  # removed before the block began
            assert (hook.kind, hook.scope) == (expected["kind"], expected["scope"])
            assert hook.with_kwargs == expected.get("with_kwargs", False)
            assert hook.always_call == expected.get("always_call", False)
            if expected.get("prepend") and hid in {h.id for h in t.trace.hooks if h.registered_at}:
                assert hook.prepend_source == "registration"
    finally:
        for h in handles:
            h.remove()
        torch.nn.modules.module._global_is_full_backward_hook = None
