"""Issue 21, real libraries, the smaller items: each with the case where it fires and the nearest one
where it must not."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.analysis.firings import place
from hooktrace.schema import Hook


def _surprises(trace: Any, rule: str) -> list:
    return [s for s in trace.surprises if s.rule == rule]


# -- what a hook is "on": optimizer, global and saved-tensor hooks are on no module ----------------
def _hook(**fields: Any) -> Hook:
    base = dict(id=1, kind="forward", scope="module", module=None, tensor=None, name="h")
    base.update(fields)
    return Hook(**base)


def test_optimizer_global_and_saved_tensor_hooks_are_not_on_a_module_outside_the_model():
    assert place(_hook(kind="optimizer_step_pre", scope="optimizer")) == "an optimizer"
    assert place(_hook(kind="optimizer_step_pre", scope="global")) == "every optimizer"
    assert place(_hook(kind="forward_pre", scope="global")) == "every module (global)"
    assert place(_hook(kind="unpack", scope="saved_tensors")) == "saved tensors"
    # the nearest case: a module hook whose module is not in the model still says so
    assert place(_hook(kind="forward", scope="module", module=None)) == "a module outside the model"
    assert place(_hook(kind="forward", scope="module", module="")) == "`<root>`"


def test_an_optimizer_hook_that_replaces_its_arguments_is_said_to_be_on_an_optimizer():
    m = nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with hooktrace.trace(m) as t:
        opt.register_step_pre_hook(lambda o, args, kwargs: (tuple(args), dict(kwargs)))  # new objects
        m(torch.randn(1, 2)).sum().backward()
        opt.step()
    [replaced] = _surprises(t.trace, "replaced-value")
    assert "optimizer_step_pre on an optimizer" in replaced.message
    assert "outside the model" not in replaced.message


# -- a hook on torch.compile(m)'s wrapper: its events and the hook name the same module --------------
def test_a_hook_on_the_compiled_wrapper_and_its_events_name_the_same_module():
    dynamo = pytest.importorskip("torch._dynamo")
    from torch._dynamo.testing import CompileCounter

    dynamo.reset()
    m = nn.Sequential(nn.Linear(2, 2))
    c = torch.compile(m, backend=CompileCounter())
    handle = c.register_forward_hook(lambda mod, a, o: None)
    try:
        with hooktrace.trace(c) as t:
            c(torch.randn(1, 2))
    finally:
        handle.remove()
        dynamo.reset()
    trace = t.trace
    [hook] = [h for h in trace.hooks if h.id == handle.id]
    events = [e for e in trace.hook_events() if e.hook == handle.id]
    assert hook.module == "" and events and all(e.module == "" for e in events)
    assert [m.path for m in trace.modules] == ["", "0"]  # named as m (no `_orig_mod`)
    assert "_orig_mod" not in {e.module for e in trace.events}


# -- transformers' output_capturing_hook: its own line, not its helper's -----------------------------
def test_transformers_output_capturing_hook_is_named_and_placed_by_itself():
    capturing = pytest.importorskip("transformers.utils.output_capturing")
    m = nn.Linear(2, 2)
    with hooktrace.trace(m) as t:
        capturing.install_output_capuring_hook(m, "hidden_states", 0)
        m(torch.randn(1, 2))
    [hook] = t.trace.hooks
    assert hook.name.endswith("output_capturing_hook") and "→" not in hook.name
    source, line = hook.defined_at.rsplit(":", 1)
    assert source == "transformers/utils/output_capturing.py"
    code = capturing.install_output_capuring_hook.__code__
    inner = [c for c in code.co_consts if getattr(c, "co_name", "") == "output_capturing_hook"]
    assert int(line) == inner[0].co_firstlineno


def _wrap_hook(fn: Any) -> Any:  # a library wrapper given the user's function: still named after it
    def full_hook(module: Any, args: Any, output: Any) -> Any:
        return fn(output)

    return full_hook


def my_ablation(output: Any) -> None:
    return None


def test_a_closure_given_the_users_function_is_still_named_after_it():
    m = nn.Linear(2, 2)
    with hooktrace.trace(m) as t:
        m.register_forward_hook(_wrap_hook(my_ablation))
        m(torch.randn(1, 2))
    [hook] = t.trace.hooks
    assert hook.name == "full_hook → my_ablation"


# -- never-fired: spectral norm's removed hooks, checkpoint's recomputation hook ---------------------
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_spectral_norm_state_dict_hook_removed_by_remove_spectral_norm_is_no_never_fired():
    from torch.nn.utils import remove_spectral_norm, spectral_norm

    def run(remove: bool) -> list[str]:
        m = nn.Linear(2, 2)
        with hooktrace.trace(m) as t:
            spectral_norm(m)
            m(torch.randn(1, 2))
            if remove:
                remove_spectral_norm(m)
        return [s.message for s in _surprises(t.trace, "never-fired")]

    kept, removed = run(False), run(True)
    assert any("SpectralNormStateDictHook" in s for s in kept)  # still registered: never asked for
    assert not any("SpectralNormStateDictHook" in s for s in removed)  # taken out again: nothing to say


def test_checkpoint_recomputation_unpack_hook_is_no_never_fired_but_a_users_is():
    from torch.utils.checkpoint import checkpoint

    m = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    x = torch.randn(1, 2, requires_grad=True)
    with hooktrace.trace(m) as t:
        checkpoint(m, x, use_reentrant=False).sum().backward()
    assert [h for h in t.trace.hooks if "_recomputation_hook" in h.name]  # traced, and it never unpacks
    assert not _surprises(t.trace, "never-fired")
    # the nearest case: the user's own saved-tensor hooks, whose unpack never ran (no backward)
    with hooktrace.trace(m) as t:
        with torch.autograd.graph.saved_tensors_hooks(lambda v: v, lambda v: v):
            m(x)
    [never] = _surprises(t.trace, "never-fired")
    assert "unpack on saved tensors" in never.message


# -- a library's own hooks (registered from inside an installed package) are info ---------------------
_LIBRARY = """
def log_grads(model):
    def fwd(module, args, output):
        output.register_hook(lambda g: g * 1)  # a new tensor: PyTorch uses it (replaced-value)
    for m in model.modules():
        m.register_forward_hook(fwd)
"""


def _replaced_levels(filename: str) -> set[str]:
    namespace: dict[str, Any] = {}
    exec(compile(_LIBRARY, filename, "exec"), namespace)  # noqa: S102 - a library's code at its own path
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    with hooktrace.trace(m) as t:
        namespace["log_grads"](m)
        m(torch.randn(1, 2)).sum().backward()
    found = _surprises(t.trace, "replaced-value")
    assert found
    return {s.level for s in found}


def test_grad_hooks_registered_inside_an_installed_library_are_info_not_warn():
    site = os.path.dirname(os.path.dirname(torch.__file__))  # site-packages
    assert _replaced_levels(os.path.join(site, "fakelens_for_test", "hooks.py")) == {"info"}
    # the nearest case: the same code in the user's own file is the user's hook
    assert _replaced_levels(os.path.abspath("user_lens_for_test.py")) == {"warn"}
