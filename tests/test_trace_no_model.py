"""`hooktrace.trace()` with no model: each outermost module call is a root (docs/contract.md, Scripts and Python API)."""

from __future__ import annotations

import copy

import torch

import hooktrace

from .oracle import Zoo, snapshot_dicts


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.act = torch.nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


def _hook_modules(trace: hooktrace.Trace, zoo: Zoo) -> dict[str, str]:
    return {zoo.labels[h.id]: h.module for h in trace.hooks if h.id in zoo.labels}


def test_two_roots_a_model_and_a_loss_module():
    torch.manual_seed(0)
    model, loss_fn = Net(), torch.nn.MSELoss()
    zoo = Zoo()
    zoo.module(model.fc, "forward_pre", "fc_pre")
    zoo.module(model, "forward", "model_out")
    zoo.module(loss_fn, "forward", "loss_out")
    zoo.module(model.fc, "backward", "fc_grad")
    x, y = torch.randn(2, 4, requires_grad=True), torch.randn(2, 3)
    before = snapshot_dicts(model)

    zoo.log.clear()
    with hooktrace.trace() as t:
        loss_fn(model(x), y).backward()
    assert zoo.traced(t.trace) == zoo.log == ["fc_pre", "model_out", "loss_out", "fc_grad"]
    assert [(m.path, m.type) for m in t.trace.modules] == [
        ("Net", "Net"),
        ("Net.fc", "Linear"),
        ("Net.act", "ReLU"),
        ("MSELoss", "MSELoss"),
    ]
    assert _hook_modules(t.trace, zoo) == {
        "fc_pre": "Net.fc",
        "model_out": "Net",
        "loss_out": "MSELoss",
        "fc_grad": "Net.fc",
    }
    calls = [(e.type, e.module) for e in t.trace.events if e.type == "enter"]
    assert calls == [("enter", "Net"), ("enter", "Net.fc"), ("enter", "Net.act"), ("enter", "MSELoss")]
    assert snapshot_dicts(model) == before


def test_an_ema_copy_is_a_second_root_of_the_same_class():
    torch.manual_seed(0)
    model = Net()
    ema = copy.deepcopy(model)
    zoo = Zoo()
    zoo.module(model.act, "forward", "model_act")
    zoo.module(ema.act, "forward", "ema_act")
    x = torch.randn(2, 4)
    zoo.log.clear()
    with hooktrace.trace() as t:
        model(x).sum().backward()
        with torch.no_grad():
            ema(x)
    assert zoo.traced(t.trace) == zoo.log == ["model_act", "ema_act"]
    assert _hook_modules(t.trace, zoo) == {"model_act": "Net.act", "ema_act": "Net#2.act"}
    assert [m.path for m in t.trace.modules] == ["Net", "Net.fc", "Net.act", "Net#2", "Net#2.fc", "Net#2.act"]


def test_one_root_keeps_plain_paths_and_a_submodule_called_alone_is_not_a_root():
    torch.manual_seed(0)
    model = Net()
    zoo = Zoo()
    zoo.module(model.fc, "forward", "fc_out")
    x = torch.randn(2, 4)
    zoo.log.clear()
    with hooktrace.trace() as t:
        model.fc(x)  # called on its own first: still a part of `model`, the root called next
        model(x)
    assert zoo.traced(t.trace) == zoo.log == ["fc_out", "fc_out"]
    assert [m.path for m in t.trace.modules] == ["", "fc", "act"]
    assert _hook_modules(t.trace, zoo) == {"fc_out": "fc"}
    assert [e.module for e in t.trace.events if e.type == "enter"] == ["fc", "", "fc", "act"]


def test_a_module_given_is_the_only_root():
    model, other = Net(), torch.nn.Linear(3, 1)
    with hooktrace.trace(model) as t:
        other(model(torch.randn(2, 4)))
    assert [m.path for m in t.trace.modules] == ["", "fc", "act"]
    # a module called that is not part of the model is named by its class
    assert [e.module for e in t.trace.events if e.type == "enter"] == ["", "fc", "act", "(outside) Linear"]


def test_nothing_called_gives_no_modules():
    with hooktrace.trace() as t:
        torch.randn(2).sum()
    assert t.trace.modules == [] and t.trace.events == []


def test_a_closure_given_to_optimizer_step_is_not_the_optimizer_phase():
    """Lightning and LBFGS run forward and backward in a closure inside `optimizer.step(closure)`."""
    torch.manual_seed(0)
    model = Net()
    zoo = Zoo()
    zoo.module(model.fc, "forward", "fc_out")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    zoo_post = opt.register_step_post_hook(zoo.fn("post"))
    zoo.labels[zoo_post.id] = "post"
    x = torch.randn(2, 4)

    def closure():
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        return loss

    zoo.log.clear()
    with hooktrace.trace() as t:
        opt.step(closure)
        opt.step(closure=closure)
    assert zoo.traced(t.trace) == zoo.log == ["fc_out", "post"] * 2
    phases = [(zoo.labels[e.hook], e.phase) for e in t.trace.events if e.type == "hook"]
    assert phases == [("fc_out", "forward"), ("post", "optimizer")] * 2
    assert {e.phase for e in t.trace.events if e.type == "enter"} == {"forward"}


def _parameter_hooks_before(traced_model: bool) -> tuple[list[str], list[str], hooktrace.Trace]:
    """Parameter hooks registered before the block, on the model and on a loss module outside it.
    Untraced, the same code gives the same record, gradients and parameters' hook dicts (the same
    objects, in the same order) as traced."""
    from .training_hooks import Log

    def make() -> tuple[Net, torch.nn.Linear, Log]:
        torch.manual_seed(0)
        net, head = Net(), torch.nn.Linear(3, 1)
        L = Log()
        net.fc.weight.register_hook(L.fn("fc.weight grad"))
        net.fc.bias.register_post_accumulate_grad_hook(L.fn("fc.bias post"))
        head.weight.register_hook(L.fn("head.weight grad"))
        net.register_forward_hook(L.fn("net forward"))
        return net, head, L

    def state(net: Net, head: torch.nn.Linear) -> tuple[list, list]:
        params = [*net.parameters(), *head.parameters()]
        # handle ids count on across the two runs: the hooks' names, in dict order
        dicts = [[fn.__qualname__ for fn in (p._backward_hooks or {}).values()]
                 + [fn.__qualname__ for fn in (p._post_accumulate_grad_hooks or {}).values()]
                 for p in params]  # fmt: skip
        return [p.grad for p in params], dicts

    net, head, plain = make()
    head(net(torch.ones(2, 4))).sum().backward()
    grads, dicts = state(net, head)
    net, head, L = make()
    before = [dict(p._backward_hooks or {}) for p in net.fc.parameters()]
    with hooktrace.trace(net if traced_model else None) as t:
        head(net(torch.ones(2, 4))).sum().backward()
    traced_grads, traced_dicts = state(net, head)
    assert L.log == plain.log and traced_dicts == dicts
    assert all(torch.equal(a, b) for a, b in zip(grads, traced_grads))
    assert [dict(p._backward_hooks or {}) for p in net.fc.parameters()] == before  # the user's own objects
    return L.log, L.traced(t.trace), t.trace


def test_parameter_hooks_registered_before_the_block_are_traced_without_a_model():
    log, traced, trace = _parameter_hooks_before(traced_model=False)
    assert traced == log  # the hooks' own record, every one of them
    assert {"fc.weight grad", "fc.bias post", "head.weight grad"} <= set(traced)
    assert not [s for s in trace.surprises if s.rule == "never-fired"]
    # each on its parameter, named under its root as section 2b names modules without a model
    tensors = {h.name: h.tensor for h in trace.hooks}
    assert (
        tensors["hook_fc.weight grad"] == "Net.fc.weight"
        and tensors["hook_head.weight grad"] == "Linear.weight"
    )


def test_with_a_model_a_loss_module_outside_it_has_its_parameter_hooks_traced_too():
    log, traced, trace = _parameter_hooks_before(traced_model=True)
    assert traced == log and "head.weight grad" in traced
    assert not [s for s in trace.surprises if s.rule == "never-fired"]


def test_module_root_on_the_command_line_of_a_trace_with_two_roots(tmp_path, capsys):
    """`--module "<root>"` where no module is the root: the command line draws what `tree_text` draws
    (the `--module` rule was applied twice on its way, and the second time said "no module ''")."""
    from hooktrace.cli import main

    model, loss_fn = Net(), torch.nn.MSELoss()
    model.fc.register_forward_hook(lambda m, a, o: None)
    with hooktrace.trace() as t:
        loss_fn(model(torch.randn(2, 4)), torch.randn(2, 3))
    path, text = tmp_path / "t.json", tmp_path / "t.txt"
    t.trace.save(path)
    assert main(["render", str(path), "--module", "<root>"]) == 0
    assert "error" not in capsys.readouterr().err
    assert main(["render", str(path), "--module", "<root>", "-f", "tree", "-o", str(text)]) == 0
    assert text.read_text() == hooktrace.tree_text(hooktrace.load(path), module="<root>")
