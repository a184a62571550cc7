"""`never-fired`: real hooks that did not fire, and the reason only when the trace proves it."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import hooktrace
from hooktrace.analysis.surprises import find_surprises
from hooktrace.options import RunOptions
from hooktrace.runs.factory import run
from hooktrace.target import Factory
from tests.oracle import Zoo


def never_fired(trace: hooktrace.Trace) -> dict[int, hooktrace.schema.Surprise]:
    return {hid: s for s in trace.surprises if s.rule == "never-fired" for hid in s.hooks}


def lin() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))


def factory(make) -> Factory:
    return Factory(spec="test:make", func=make, label="make()")


def test_module_never_called_and_container():
    m = nn.Sequential(nn.Linear(3, 3), nn.ModuleList([nn.Linear(3, 3)]))
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        unused = zoo.module(m[1][0], "forward", "on_unused")
        container = zoo.module(m[1], "forward_pre", "on_list")
        m[0](torch.randn(1, 3))
    unused.remove()
    container.remove()
    found = never_fired(t.trace)
    assert "its module was never called while tracing" in found[unused.id].message
    assert "container" in found[container.id].message and found[container.id].level == "warn"


def test_backward_hook_in_a_forward_only_api_trace_says_the_trace_cannot_tell():
    m = lin()
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        bw = zoo.module(m[1], "backward", "needs_backward")
        m(torch.randn(1, 3))
    bw.remove()
    message = never_fired(t.trace)[bw.id].message
    assert "does not show whether a backward pass ran" in message
    assert "no backward pass ran" not in message


def test_no_backward_flag_is_what_the_user_asked_for():
    """`hooktrace run --no-backward`: backward hooks not firing is no surprise; forward ones still are."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.seq = lin()
            self.unused = nn.Linear(3, 3)

        def forward(self, x):
            return self.seq(x)

    def make():
        m = Net()
        m.seq[1].register_full_backward_hook(lambda *a: None)
        m.seq[1].register_full_backward_pre_hook(lambda *a: None)
        m.unused.register_forward_hook(lambda *a: None)
        return m, torch.randn(2, 3)

    result = run(factory(make), RunOptions(backward=False))
    assert result.trace.meta.backward == "off"
    found = never_fired(result.trace)
    kinds = {result.trace.hook(hid).kind for hid in found}
    assert kinds == {"forward"}  # the unused module's hook; not the backward ones
    with_backward = run(factory(make))
    assert with_backward.trace.meta.backward == "ran"
    assert not {with_backward.trace.hook(hid).kind for hid in never_fired(with_backward.trace)} & {"backward"}


def test_nothing_requires_grad_is_said_when_the_run_driver_skipped_backward():
    def make():
        m = lin().requires_grad_(False)
        m[1].register_full_backward_hook(lambda *a: None)
        return m, torch.randn(2, 3)

    result = run(factory(make))
    assert result.trace.meta.backward == "no-grad"
    [s] = never_fired(result.trace).values()
    assert "nothing in the output required grad" in s.message


class Keeper(nn.Module):
    """A forward hook keeps the module's output; the loss is computed from what it kept."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(3, 3)
        self.kept: list[torch.Tensor] = []


def test_forward_hook_kept_the_output_before_backward_hooks_wrapped_it():
    """Backward ran (the parameter's grad hook fired), yet the full backward hook did not: the loss
    used the output as the forward hook saw it, before PyTorch wrapped it for backward hooks."""
    m = Keeper()
    calls: list[str] = []
    with hooktrace.trace(m) as t:
        keep = m.fc.register_forward_hook(lambda mod, args, out: m.kept.append(out))
        full = m.fc.register_full_backward_hook(lambda *a: calls.append("full"))
        grad = m.fc.weight.register_hook(lambda g: calls.append("weight_grad"))
        m.fc(torch.randn(2, 3))
        m.kept[0].sum().backward()
    for h in (keep, full, grad):
        h.remove()
    assert calls == ["weight_grad"]  # PyTorch itself: the full backward hook never ran
    message = never_fired(t.trace)[full.id].message
    assert "backward ran and gradient reached fc.weight" in message
    assert "forward hook" in message and "no backward pass ran" not in message


def test_full_backward_hook_of_an_unused_output_names_no_cause():
    """Backward ran through another branch; nothing proves why `b` got no gradient: say so."""
    torch.manual_seed(0)
    m = nn.ModuleDict({"a": nn.Linear(3, 3), "b": nn.Linear(3, 3)})
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        a = zoo.module(m["a"], "backward", "a_full")
        b = zoo.module(m["b"], "backward", "b_full")
        keep = m["b"].register_forward_hook(lambda *args: None)
        x = torch.randn(2, 3, requires_grad=True)
        m["b"](x)  # called, but its output is not used by the loss
        m["a"](x).sum().backward()
    for h in (a, b, keep):
        h.remove()
    assert zoo.log == ["a_full"]
    message = never_fired(t.trace)[b.id].message
    assert "the trace does not show why" in message and "gradient reached" not in message


def test_forward_hook_of_a_module_that_raised():
    m = lin()
    zoo = Zoo()
    with pytest.raises(ValueError):
        with hooktrace.trace(m) as t:
            zoo.module(m[0], "forward_pre", "bad", raises=ValueError("no"))
            after = zoo.module(m[0], "forward", "after")
            bw = zoo.module(m[0], "backward", "bw")
            m(torch.randn(1, 3))
    found = never_fired(t.trace)
    assert "raised before its forward hooks ran" in found[after.id].message
    assert "raised ValueError: no and no backward hook fired after it" in found[bw.id].message


def test_state_dict_hooks_not_asked_for_are_info():
    m = lin()
    with hooktrace.trace(m) as t:
        sd = m[0].register_state_dict_pre_hook(lambda *a: None)
        load = m[0].register_load_state_dict_post_hook(lambda *a: None)
        m(torch.randn(1, 3))
    sd.remove()
    load.remove()
    found = never_fired(t.trace)
    assert found[sd.id].level == found[load.id].level == "info"
    assert "no state_dict() call was made" in found[sd.id].message
    assert "no load_state_dict() call was made" in found[load.id].message


def test_state_dict_hooks_fire_when_asked_for():
    m = lin()
    with hooktrace.trace(m) as t:
        sd = m[0].register_state_dict_pre_hook(lambda *a: None)
        m.state_dict()
    sd.remove()
    assert sd.id not in never_fired(t.trace)


def test_optimizer_state_dict_hooks_not_asked_for_name_their_call():
    m = lin()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with hooktrace.trace(m) as t:
        sd = opt.register_state_dict_pre_hook(lambda *a: None)
        load = opt.register_load_state_dict_post_hook(lambda *a: None)
        m(torch.randn(1, 3)).sum().backward()
        opt.step()
    sd.remove()
    load.remove()
    found = never_fired(t.trace)
    assert found[sd.id].level == found[load.id].level == "info"
    assert "the optimizer's state_dict() was not called while tracing" in found[sd.id].message
    assert "the optimizer's load_state_dict() was not called while tracing" in found[load.id].message


def test_optimizer_state_dict_hooks_fire_when_asked_for():
    m = lin()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with hooktrace.trace(m) as t:
        sd = opt.register_state_dict_pre_hook(lambda *a: None)
        load = opt.register_load_state_dict_post_hook(lambda *a: None)
        opt.load_state_dict(opt.state_dict())
    sd.remove()
    load.remove()
    found = never_fired(t.trace)
    assert sd.id not in found and load.id not in found


def test_a_hook_that_fired_is_never_never_fired():
    """Every hook with events is out of never-fired, whatever its scope."""
    m = lin()
    x = torch.randn(1, 3, requires_grad=True)
    with hooktrace.trace(m) as t:
        h = x.register_hook(lambda g: None)
        m(x).sum().backward()
    h.remove()
    fired = {e.hook for e in t.trace.events if e.type == "hook"}
    assert h.id in fired
    assert not set(never_fired(t.trace)) & fired
    assert find_surprises(t.trace) == t.trace.surprises


NODE_HOOK_OF_STEP_0 = """
import torch
from torch import nn

m = nn.Linear(3, 1)
m.register_full_backward_hook(lambda module, grad_input, grad_output: None)  # backward ran: shown
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(3):
    out = m(torch.randn(2, 3)).sum()
    if i == 0:
        out.grad_fn.register_prehook(lambda grad_outputs: print("ran in step 0"))
    out.backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.parametrize("start", [0, 1])
def test_a_node_hook_that_fired_before_the_window_is_not_said_to_have_never_run(tmp_path, start):
    # Step 0's graph runs its node (the hook prints) and is gone. Traced from step 0 the hook fires;
    # with step 0 untraced (exec --start 1, run --warmup 1) it cannot fire in the window, and the
    # reason must not claim backward never ran its node after the registration: it did, unseen.
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(NODE_HOOK_OF_STEP_0)
    out = tmp_path / "t.json"
    done = subprocess.run(
        [sys.executable, "-m", "hooktrace", "exec", "--start", str(start), "-o", str(out), str(script)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("ran in step 0") == 1  # the hook did run, once, in step 0
    trace = hooktrace.load(out)
    found = never_fired(trace)
    if start == 0:
        assert not found  # it fired inside the window
        return
    [surprise] = found.values()
    assert "backward did not run its autograd node in the traced steps" in surprise.message
    assert "after it was registered" not in surprise.message


def test_a_node_hook_whose_node_never_ran_is_said_so_without_a_warmup():
    m = lin()
    m[1].register_full_backward_hook(lambda module, grad_input, grad_output: None)  # backward ran: shown
    with hooktrace.trace(m) as t:
        out = m(torch.randn(2, 3)).sum()
        handle = out.grad_fn.register_prehook(lambda grad_outputs: None)
        m(torch.randn(2, 3)).sum().backward()  # another graph: out's node never runs
    handle.remove()
    [surprise] = never_fired(t.trace).values()
    assert "backward did not run its autograd node after it was registered" in surprise.message
