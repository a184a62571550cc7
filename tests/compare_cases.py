"""The upstream torch.compile hook issues as `hooktrace run` factories (`--compare-eager`'s test
cases, tests/test_compare_eager.py), each beside the nearest case where its rule must not fire.

Each hook appends its own name to `RECORD` as it runs (the hooks' own record). Factories that
register global hooks leave them registered: the tests remove them (`global_hooks` fixture).
"""

from __future__ import annotations

import torch
from torch import nn

from hooktrace import Target

RECORD: list[str] = []


def record_output(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
    RECORD.append("record_output")


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))


def stale() -> Target:
    """pytorch/pytorch#117758: a forward hook registered after the first compiled call never runs."""
    model = _mlp()
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(4, 8)
    compiled(x)  # the graph is compiled now, with no hook
    model[0].register_forward_hook(record_output)
    return Target(compiled, x)


def stale_not() -> Target:
    """The nearest case: the same hook registered before the first call is inlined into the graph."""
    model = _mlp()
    compiled = torch.compile(model, backend="eager")
    model[0].register_forward_hook(record_output)
    x = torch.randn(4, 8)
    compiled(x)
    return Target(compiled, x)


def double_grad(module: nn.Module, grad_output: tuple) -> tuple:
    RECORD.append("double_grad")
    return tuple(g * 2 for g in grad_output)


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def stale_backward() -> Target:
    """pytorch/pytorch#117265: a full backward pre-hook registered after the compile never runs."""
    model = _Layer()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    compiled(torch.randn(3, requires_grad=True))
    model.layer.register_full_backward_pre_hook(double_grad)
    return Target(compiled, torch.randn(3, requires_grad=True))


def global_hook(module: nn.Module, args: tuple, output: object) -> None:
    RECORD.append(f"global_hook {type(module).__name__}")


def wrapper() -> Target:
    """pytorch/pytorch#149502: global hooks fire for torch.compile(m)'s OptimizedModule too, and (with
    AOTAutograd) for its compiled forward, a GraphModule."""
    model = _mlp()
    torch.nn.modules.module.register_module_forward_hook(global_hook)
    return Target(torch.compile(model, backend="aot_eager"), torch.randn(4, 8))


def wrapper_not() -> Target:
    """The nearest case: m.compile() compiles in place (no wrapper); the eager backend (no GraphModule)."""
    model = _mlp()
    torch.nn.modules.module.register_module_forward_hook(global_hook)
    model.compile(backend="eager")
    return Target(model, torch.randn(4, 8))


def guarded(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
    if torch.compiler.is_compiling():
        return
    RECORD.append("guarded")


def scaled(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    RECORD.append("scaled")
    return output * 2


def no_ops() -> Target:
    """pytorch/pytorch#173452: a hook guarded by torch.compiler.is_compiling() does nothing compiled."""
    model = _mlp()
    model[0].register_forward_hook(guarded)
    return Target(torch.compile(model, backend="eager"), torch.randn(4, 8))


def no_ops_not() -> Target:
    """The nearest case: a hook with an op is inlined into the graph, and runs there."""
    model = _mlp()
    model[0].register_forward_hook(scaled)
    return Target(torch.compile(model, backend="eager"), torch.randn(4, 8))


def pack(x: torch.Tensor) -> torch.Tensor:
    RECORD.append("pack")
    return x


def unpack(x: torch.Tensor) -> torch.Tensor:
    RECORD.append("unpack")
    return x


class _Saved(nn.Module):
    """Runs its (compiled) inner model under saved-tensor hooks, as #116221's caller does."""

    def __init__(self, backend: str) -> None:
        super().__init__()
        self.inner = _Two()
        self.compiled = torch.compile(self.inner, backend=backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return self.compiled(x)


class _Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x))).sin()


def saved() -> Target:
    """pytorch/pytorch#116221: saved-tensor hooks run after the compiled forward, another number of times."""
    torch.manual_seed(0)
    return Target(_Saved("aot_eager"), torch.randn(2, 4))


def saved_not() -> Target:
    """The nearest case: the eager backend runs the graph's ops one by one, packing as they save."""
    torch.manual_seed(0)
    return Target(_Saved("eager"), torch.randn(2, 4))


ACTIVATIONS: list[torch.Tensor] = []


def keep(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
    ACTIVATIONS.append(output.detach())


def growing() -> Target:
    """pytorch/pytorch#93724: a hook appending to a growing list recompiles every call until the limit."""
    ACTIVATIONS.clear()
    model = _mlp()
    model[0].register_forward_hook(keep)
    return Target(torch.compile(model, backend="eager"), torch.randn(4, 8))


def growing_not() -> Target:
    """The nearest case: the hook keeps only the last activation (no guard on a length that grows)."""
    model = _mlp()
    last: dict[str, torch.Tensor] = {}

    def keep_last(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        last["out"] = output.detach()

    model[0].register_forward_hook(keep_last)
    return Target(torch.compile(model, backend="eager"), torch.randn(4, 8))
