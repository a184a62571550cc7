"""`hooktrace run --warmup N` (issue 26 item 3): N steps run for real and untraced before the traced
ones, registrations made meanwhile are still in the trace, and the times say when they include
first-call work. The hooks record their own calls; the trace is compared with that record."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.options import RunOptions
from hooktrace.runs.factory import run
from hooktrace.target import Factory

from .oracle import Zoo, assert_no_shims, snapshot_dicts
from .test_cli import SAMPLES, invoke


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Made:
    """A factory whose hooks record themselves: the zoo's log of labels, the log's length at the end
    of each step (`marks`), each step's output and gradients, and the model and optimizer it made."""

    def __init__(self) -> None:
        self.zoo = Zoo()
        self.marks: list[int] = []
        self.outputs: list[torch.Tensor] = []
        self.grads: list[list[torch.Tensor]] = []
        self.model: Any = None
        self.optimizer: Any = None
        self.lazy: Any = None  # the handle the first forward registers, as a lazy init does
        self.gone: Any = None  # a hook the factory registers and the first forward removes
        self.accs: list[Any] = []

    def __call__(self) -> hooktrace.Target:
        torch.manual_seed(0)
        zoo, model = self.zoo, Net()
        zoo.module(model.fc1, "forward_pre", "fc1.pre")
        zoo.module(model.fc1, "forward", "fc1.post", with_kwargs=True, always_call=True)
        zoo.module(model.fc2, "backward", "fc2.bwd")
        zoo.tensor(model.fc1.weight, "grad", "fc1.weight.grad")
        self.gone = zoo.module(model.fc2, "forward_pre", "gone")
        acc1 = model.fc1.weight.view_as(model.fc1.weight).grad_fn.next_functions[0][0]
        zoo._keep(acc1.register_prehook(zoo.fn("fc1.weight.acc_pre")), "fc1.weight.acc_pre")
        self.accs = [acc1]  # AccumulateGrad nodes live while something holds them (FSDP1 keeps them)

        def lazy_init(module: nn.Module, args: Any) -> None:
            if self.lazy is None:  # first call only: register a hook in front of fc2's own
                self.lazy = zoo.module(model.fc2, "forward_pre", "fc2.lazy", prepend=True)
                self.gone.remove()
                acc2 = model.fc2.weight.view_as(model.fc2.weight).grad_fn.next_functions[0][0]
                zoo._keep(acc2.register_hook(zoo.fn("fc2.weight.acc")), "fc2.weight.acc")
                self.accs.append(acc2)

        model.register_forward_pre_hook(lazy_init)
        model.register_forward_hook(lambda m, a, out: self.outputs.append(out.detach().clone()))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        optimizer.register_step_pre_hook(
            lambda opt, a, k: self.grads.append([p.grad.detach().clone() for p in model.parameters()])
        )
        optimizer.register_step_post_hook(lambda opt, a, k: self.marks.append(len(zoo.log)))
        self.model, self.optimizer = model, optimizer
        return hooktrace.Target(model, inputs=torch.randn(3, 4), optimizer=optimizer)


def factory(made: Made) -> Factory:
    return Factory(spec="test_run_warmup.py:make", func=made, label="make()")


def untraced(made: Made, steps: int) -> None:
    """What `run` does, by hand: forward, sum, backward, step, zero_grad."""
    target = made()
    for _ in range(steps):
        target.model(target.inputs).sum().backward()
        target.optimizer.step()
        target.optimizer.zero_grad()


@pytest.fixture(scope="module")
def warm() -> tuple[Made, Any]:
    made = Made()
    result = run(factory(made), RunOptions(steps=2, warmup=3))
    assert result.error is None, result.error
    return made, result


def test_warm_up_steps_run_for_real_and_only_the_traced_steps_are_in_the_trace(
    warm: tuple[Made, Any],
) -> None:
    made, result = warm
    trace = result.trace
    assert len(made.marks) == 5  # 3 warm-up steps + 2 traced, by the optimizer's own hook
    assert made.zoo.log.count("fc1.pre") == 5 and made.zoo.log.count("fc2.bwd") == 5
    traced = made.zoo.traced(trace)
    assert traced == made.zoo.log[made.marks[2] : made.marks[4]]  # exactly steps 3 and 4, in order
    assert traced.count("fc1.pre") == 2 and traced.count("fc1.weight.grad") == 2
    assert traced.count("fc1.weight.acc_pre") == 2 and traced.count("fc2.weight.acc") == 2  # node hooks
    assert {e.step for e in trace.events} == {0, 1}  # numbered from the first traced step
    assert trace.meta.warmup == 3 and trace.meta.steps == 2
    assert "gone" not in traced  # removed in warm-up step 0: never fired in the traced steps


def test_registrations_of_the_factory_and_of_warm_up_are_in_the_trace(warm: tuple[Made, Any]) -> None:
    made, result = warm
    hooks = {made.zoo.labels[h.id]: h for h in result.trace.hooks if h.id in made.zoo.labels}
    post = hooks["fc1.post"]
    assert (post.with_kwargs, post.always_call, post.module) == (True, True, "fc1")
    assert (post.registered_at or "").startswith("tests/oracle.py:"), post  # the register_* call
    lazy = hooks["fc2.lazy"]  # registered inside the first (warm-up) forward
    assert lazy.prepend and lazy.prepend_source == "registration"
    assert lazy.registered_during_run and lazy.module == "fc2"
    # what a run that traces from the start says of the same hooks (ids aside)
    cold_made = Made()
    cold = run(factory(cold_made), RunOptions(steps=2)).trace
    seen = {cold_made.zoo.labels[h.id]: h for h in cold.hooks if h.id in cold_made.zoo.labels}
    for label, hook in hooks.items():
        assert dataclasses.replace(hook, id=0) == dataclasses.replace(seen[label], id=0), label
    assert hooks["fc1.weight.grad"].scope == "tensor" and hooks["fc1.weight.grad"].tensor == "fc1.weight"
    acc = hooks["fc2.weight.acc"]  # on an AccumulateGrad node, registered in warm-up step 0
    assert (acc.scope, acc.kind, acc.tensor, acc.module) == ("node", "node", "fc2.weight", "fc2")
    assert hooks["fc1.weight.acc_pre"].kind == "node_pre"
    assert "gone" not in hooks  # removed before the traced steps: the note says so
    assert any("1 hook registered and removed before them is not in the trace" in n for n in result.notes), (
        result.notes
    )
    assert any(n.startswith("3 warm-up steps ran untraced first") for n in result.notes), result.notes
    kinds = {h.kind for h in result.trace.hooks}
    assert {"optimizer_step_pre", "optimizer_step_post"} <= kinds


def test_a_run_with_warm_up_computes_what_an_untraced_run_computes(warm: tuple[Made, Any]) -> None:
    made, _ = warm
    plain = Made()
    untraced(plain, 5)
    assert plain.zoo.log == made.zoo.log
    assert len(made.outputs) == len(plain.outputs) == 5
    for a, b in zip(made.outputs, plain.outputs):
        assert torch.equal(a, b)
    for ga, gb in zip(made.grads, plain.grads):
        assert all(torch.equal(x, y) for x, y in zip(ga, gb))
    for x, y in zip(made.model.state_dict().values(), plain.model.state_dict().values()):
        assert torch.equal(x, y)
    sa, sb = made.optimizer.state_dict()["state"], plain.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k]["momentum_buffer"], sb[k]["momentum_buffer"]) for k in sa)


def test_after_the_run_every_hook_dict_and_torch_method_is_as_before() -> None:
    methods = {
        n: vars(nn.Module)[n] for n in ("__call__", "register_forward_hook", "register_forward_pre_hook")
    }
    tensor_hook = vars(torch.Tensor)["register_hook"]
    made = Made()
    run(factory(made), RunOptions(steps=1, warmup=2))
    snap = snapshot_dicts(made.model)
    assert_no_shims(snap)
    lazy = [k for k, _, _ in snap["fc2:_forward_pre_hooks"]]
    assert lazy[0] == made.lazy.id  # still in front, as PyTorch put it
    assert {n: vars(nn.Module)[n] for n in methods} == methods
    assert vars(torch.Tensor)["register_hook"] is tensor_hook
    with hooktrace.trace(made.model) as t:  # nothing of the run is left active
        made.model(torch.randn(1, 4))
    assert t.trace.events


def test_a_failure_in_warm_up_is_reported_as_such_with_no_events() -> None:
    class Boom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            if self.calls == 2:
                raise ValueError("second call")
            return self.fc(x)

    def make() -> Any:
        model = Boom()
        model.fc.register_forward_hook(lambda m, a, o: None)
        return model, torch.randn(1, 2)

    result = run(Factory(spec="t.py:make", func=make, label="make()"), RunOptions(warmup=3))
    assert result.error is not None and "ValueError: second call in warm-up step 1" in result.error
    assert not result.trace.events
    assert [h.module for h in result.trace.hooks] == ["fc"]  # registered by the factory: still listed
    assert any("ended in warm-up step 1 of 3" in n for n in result.notes), result.notes


# -- the command line --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-1", "1.5", "two", ""])
def test_bad_warmup_values_exit_2_with_one_error_line(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from hooktrace.cli import main

    code = main(["run", str(SAMPLES / "quickstart.py"), "--warmup", value])
    err = capsys.readouterr().err
    assert code == 2, err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ") and "--warmup" in line and "Traceback" not in err, err


def test_the_first_call_note_appears_exactly_when_step_0_is_the_first_call(tmp_path: Any) -> None:
    sample = str(SAMPLES / "checkpoint_recompute.py")
    code, cold, err = invoke("run", sample)
    assert code == 0, err
    assert "step 0's times include first-call work" in " ".join(cold.split())
    assert "--warmup 1" in cold and "warm-up step" not in err
    code, warm, err = invoke("run", sample, "--warmup", "1", "--steps", "2")
    assert code == 0, err
    flat = " ".join(warm.split())
    assert "first-call" not in flat and "(after 1 warm-up step, untraced)" in flat
    assert "step 0  (" not in warm  # the step level carries no note either
    assert "note: 1 warm-up step ran untraced first; the traced steps are numbered from 0" in err
    code, _, err = invoke("run", sample, "--warmup", "1", "-o", str(tmp_path / "w.json"))
    assert code == 0, err
    saved = hooktrace.load(str(tmp_path / "w.json"))
    assert saved.meta.warmup == 1 and {e.step for e in saved.events} == {0}
    code, drawn, err = invoke("render", str(tmp_path / "w.json"))  # the saved trace says it too
    assert code == 0 and "(after 1 warm-up step, untraced)" in " ".join(drawn.split()), err
    chrome = {}
    for name, args in (("cold", ()), ("warm", ("--warmup", "1"))):
        code, text, err = invoke("run", sample, *args, "-f", "chrome")
        assert code == 0, err
        chrome[name] = json.loads(text)
    assert "first-call work" in chrome["cold"]["otherData"]["times"]
    assert "first-call work" in chrome["cold"]["traceEvents"][0]["args"]["name"]
    assert chrome["warm"]["otherData"]["times"] == "after 1 warm-up step, untraced"
    assert "first-call" not in json.dumps(chrome["warm"])


def test_the_html_report_carries_the_same_words() -> None:
    from hooktrace.render.html import trace_data

    made = Made()
    cold = run(factory(made), RunOptions()).trace
    warm = run(factory(Made()), RunOptions(warmup=1)).trace
    assert "first-call work" in trace_data(cold)["times"]
    assert trace_data(warm)["times"] == "after 1 warm-up step, untraced"
    with hooktrace.trace(made.model) as t:  # the Python API does not know: it claims nothing
        made.model(torch.randn(1, 4))
    assert t.trace.meta.warmup is None and trace_data(t.trace)["times"] is None


def test_warmup_goes_to_every_rank_in_the_options_they_receive() -> None:
    from hooktrace.ranks.launch import _plain

    sent = _plain(RunOptions(steps=2, warmup=3))
    assert sent["warmup"] == 3
    assert RunOptions(**json.loads(json.dumps(sent))).warmup == 3


def test_exec_start_sees_node_hooks_registered_before_its_window(tmp_path: Any) -> None:
    """`exec --start K` is the same untraced stretch: a hook on an AccumulateGrad node registered
    before the window (as FSDP1 and DeepSpeed do) is traced in it, with where it was registered."""
    from hooktrace.runs.script import ExecOptions, Script, run_script

    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(3, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "acc = model.weight.view_as(model.weight).grad_fn.next_functions[0][0]\n"
        "calls = []\n"
        "def on_acc(*args):\n"
        "    calls.append(1)\n"
        "acc.register_hook(on_acc)\n"
        "for _ in range(3):\n"
        "    model(torch.randn(4, 3)).sum().backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
    )
    result = run_script(Script(path=str(script)), ExecOptions(start=1, steps=1), lambda r: None)
    trace = result.trace
    (hook,) = [h for h in trace.hooks if h.name == "on_acc"]
    assert (hook.scope, hook.kind, hook.tensor) == ("node", "node", "weight")
    assert (hook.registered_at or "").endswith("train.py:8")
    assert [e.hook for e in trace.hook_events()] == [hook.id]  # its one call in the traced step
    assert trace.meta.warmup == 1
