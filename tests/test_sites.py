"""Hook names, `defined_at` and registration sites, from real registrations (docs/format.md, HOOK)."""

from __future__ import annotations

import functools
import inspect
import os
import textwrap

import torch
import torch.nn as nn

import hooktrace
from hooktrace.capture import sites


class HookPoint(nn.Module):
    """TransformerLens' shape: `add_hook` wraps the user's hook in a closure that also holds `self`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def add_hook(self, hook, dir: str = "fwd", prepend: bool = False):  # noqa: A002 - TransformerLens' name
        def full_hook(module, module_input, module_output):
            if dir == "bwd":
                module_output = module_output[0]
            return hook(module_output, hook=self)

        full_hook.__name__ = hook.__repr__()  # TransformerLens does this too: the name is not usable
        if dir == "fwd":
            return self.register_forward_hook(full_hook, prepend=prepend)
        return self.register_full_backward_hook(full_hook, prepend=prepend)


def my_ablation(activation, hook):
    return None


def line_of(fn) -> str:
    return f"tests/test_sites.py:{inspect.getsourcelines(fn)[1]}"


def traced_hooks(model: nn.Module, register) -> dict[str, hooktrace.schema.Hook]:
    with hooktrace.trace(model) as t:
        handles = register()
        model(torch.randn(2, 3, requires_grad=True)).sum().backward()
    for h in handles:
        h.remove()
    return {h.name: h for h in t.trace.hooks}


def test_transformer_lens_closure_shows_the_users_function_and_where_it_is_defined():
    point = HookPoint()
    model = nn.Sequential(point)
    ablate_pos = functools.partial(my_ablation)
    hooks = traced_hooks(
        model, lambda: [point.add_hook(my_ablation), point.add_hook(ablate_pos, dir="bwd", prepend=True)]
    )
    assert set(hooks) == {"full_hook → my_ablation", "full_hook → partial(my_ablation)"}
    assert hooks["full_hook → my_ablation"].defined_at == line_of(my_ablation)
    assert hooks["full_hook → partial(my_ablation)"].defined_at == line_of(my_ablation)
    assert hooks["full_hook → partial(my_ablation)"].prepend


def test_decorator_without_wrapped_shows_the_inner_function():
    def logged(fn):
        def wrapper(*args):
            return fn(*args)

        return wrapper

    def my_forward_hook(module, args, output):
        return None

    lin = nn.Linear(3, 3)
    hooks = traced_hooks(lin, lambda: [lin.register_forward_hook(logged(my_forward_hook))])
    [hook] = hooks.values()
    assert (
        hook.name
        == "wrapper → test_decorator_without_wrapped_shows_the_inner_function.<locals>.my_forward_hook"
    )
    assert hook.defined_at == line_of(my_forward_hook)


def test_a_closure_renamed_on_purpose_keeps_its_name():
    def make(label, returns):
        def hook(*args):
            return returns(*args)

        hook.__qualname__ = f"hook_{label}"
        return hook

    lin = nn.Linear(3, 3)
    hooks = traced_hooks(lin, lambda: [lin.register_forward_hook(make("x", my_ablation_hook))])
    assert set(hooks) == {"hook_x"}


def test_closures_that_are_not_wrappers_keep_their_own_name():
    calls: list = []
    log = calls.append  # a builtin: not a wrapped user function

    def first(*a):
        return None

    def second(*a):
        return None

    def logs(module, args, output):
        log(output)

    def calls_two(module, args, output):
        first()
        second()

    def holds_module(module, args, output):
        return lin2(output)

    lin, lin2 = nn.Linear(3, 3), nn.Linear(3, 3)
    hooks = traced_hooks(
        lin,
        lambda: [lin.register_forward_hook(f) for f in (logs, calls_two, holds_module)],
    )
    assert set(hooks) == {f"test_closures_that_are_not_wrappers_keep_their_own_name.<locals>.{n}"
                          for n in ("logs", "calls_two", "holds_module")}  # fmt: skip
    assert hooks[next(n for n in hooks if n.endswith("logs"))].defined_at == line_of(logs)
    assert len(calls) == 1


def test_defined_at_follows_the_working_directory(tmp_path, monkeypatch):
    """display_path is not cached across os.chdir: the same code is shown relative to the new cwd."""
    lin = nn.Linear(3, 3)
    here = os.getcwd()
    first = traced_hooks(lin, lambda: [lin.register_forward_hook(my_ablation_hook)])
    monkeypatch.chdir(os.path.join(here, "tests"))
    second = traced_hooks(lin, lambda: [lin.register_forward_hook(my_ablation_hook)])
    monkeypatch.chdir(tmp_path)
    third = traced_hooks(lin, lambda: [lin.register_forward_hook(my_ablation_hook)])
    line = inspect.getsourcelines(my_ablation_hook)[1]
    assert first["my_ablation_hook"].defined_at == f"tests/test_sites.py:{line}"
    assert second["my_ablation_hook"].defined_at == f"test_sites.py:{line}"
    assert third["my_ablation_hook"].defined_at == f"{os.path.join(here, 'tests', 'test_sites.py')}:{line}"
    assert second["my_ablation_hook"].registered_at.startswith("test_sites.py:")


def my_ablation_hook(module, args, output):
    return None


def test_registered_by_is_never_the_cli_framework(tmp_path, monkeypatch):
    """A hook that torch's own code registers during a `hooktrace run` step: registered_at is inside
    torch, registered_by the user's line or null — never typer's/click's file or hooktrace's."""
    target = tmp_path / "registered_by_target.py"
    target.write_text(
        textwrap.dedent(
            """
            import os

            import torch

            # a forward hook whose code lives in torch's folder, as FSDP's _pre_forward does,
            # registering a tensor hook on the output during the step
            SOURCE = "def library_forward_hook(module, args, output):\\n    output.register_hook(lambda g: None)\\n"
            LIBRARY = {}
            exec(compile(SOURCE, os.path.join(os.path.dirname(torch.__file__), "fake_library_for_test.py"), "exec"), LIBRARY)


            def make():
                model = torch.nn.Linear(3, 3)
                model.register_forward_hook(LIBRARY["library_forward_hook"])
                return model, torch.randn(2, 3)
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    from hooktrace.cli import main

    assert main(["run", f"{target.name}:make", "-o", str(tmp_path / "out.json")]) == 0
    trace = hooktrace.load(tmp_path / "out.json")
    [tensor_hook] = [h for h in trace.hooks if h.scope == "tensor"]
    assert tensor_hook.registered_at.startswith("torch/fake_library_for_test.py:")
    assert tensor_hook.registered_by is None
    [forward] = [h for h in trace.hooks if h.kind == "forward"]
    assert forward.registered_by == forward.registered_at
    assert forward.registered_at.startswith("registered_by_target.py:")


def test_frame_classes():
    assert sites._frame_class(sites.__file__) == sites.PLUMBING
    runs = os.path.join(os.path.dirname(hooktrace.__file__), "runs")
    assert sites._frame_class(os.path.join(runs, "factory.py")) == sites.DRIVER
    assert sites._frame_class(os.path.join(runs, "script.py")) == sites.DRIVER
    assert sites._frame_class(os.path.join(os.path.dirname(hooktrace.__file__), "cli.py")) == sites.DRIVER
    assert sites._frame_class("<hooktrace-shim-3>") == sites.PLUMBING
    assert sites._frame_class("<stdin>") == sites.USER
    assert sites._frame_class(__file__) == sites.USER
