"""`--device meta`: a dry run on shapes (issue 27). Every hook kind that can fire on meta fires, in
the order the hooks themselves record; what needs values fails as a raising hook does, named.

The models are built under `torch.device("meta")` (or moved there by `--device meta`); nothing is
downloaded and nothing needs transformers (tests/test_meta_llama.py has the 70B Llama)."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from typer.testing import CliRunner

import hooktrace
from hooktrace.cli import app
from hooktrace.options import RunOptions, UsageError
from hooktrace.render import render
from hooktrace.render.badges import DRY_RUN_NOTE
from hooktrace.render.tree import tree_text
from hooktrace.runs.factory import run
from hooktrace.runs.failure import meta_failure
from hooktrace.target import Factory

from .oracle import Zoo

META = torch.device("meta")


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def write(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


class Block(nn.Module):
    """A small transformer block: attention, MLP, and a saved-tensors context around the MLP."""

    def __init__(self, zoo: Zoo) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.norm = nn.LayerNorm(16)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.zoo = zoo

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x, x, x, need_weights=False)[0]
        zoo = self.zoo

        def pack(t: torch.Tensor) -> torch.Tensor:
            zoo.log.append("pack")
            return t

        def unpack(t: torch.Tensor) -> torch.Tensor:
            zoo.log.append("unpack")
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return x + self.mlp(self.norm(x))


def every_kind(zoo: Zoo, model: nn.Sequential) -> torch.optim.Optimizer:
    """Module, global, tensor, post-accumulate-grad, node and optimizer hooks that log themselves."""
    first, last = model[0], model[-1]
    for kind in ("forward_pre", "forward", "backward_pre", "backward"):
        zoo.module(first, kind, f"first.{kind}")
        zoo.module(last.mlp, kind, f"last.mlp.{kind}")
    zoo.handles = [zoo.glob("forward", "global.forward"), zoo.glob("backward_pre", "global.backward_pre")]
    zoo.tensor(last.mlp[2].weight, "grad", "last.mlp.2.weight.grad")
    zoo.tensor(first.mlp[0].weight, "post_accumulate_grad", "first.mlp.0.weight.acc")

    def on_node(module: nn.Module, args: Any, out: torch.Tensor) -> None:  # a node hook, each call
        zoo.log.append("last.out.forward")
        out.grad_fn.register_hook(zoo.fn("last.out.node"))

    handle = last.register_forward_hook(on_node)
    zoo.labels[handle.id] = "last.out.forward"
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    zoo.labels[opt.register_step_pre_hook(zoo.fn("opt.step_pre")).id] = "opt.step_pre"
    zoo.labels[opt.register_step_post_hook(zoo.fn("opt.step_post")).id] = "opt.step_post"
    return opt


def node_and_saved_labels(zoo: Zoo, trace: Any) -> list[str]:
    """The zoo's order with node and saved-tensor hooks named as they log themselves."""
    labels = []
    for e in trace.events:
        if e.type != "hook":
            continue
        if e.hook in zoo.labels:
            labels.append(zoo.labels[e.hook])
        elif e.kind in ("pack", "unpack"):
            labels.append(e.kind)
        elif e.kind == "node":
            labels.append("last.out.node")
    return labels


def block_factory(zoo: Zoo, steps_log: list[str]) -> Factory:
    def make() -> Any:
        with torch.device("meta"):
            model = nn.Sequential(Block(zoo), Block(zoo), Block(zoo))
        opt = every_kind(zoo, model)
        x = torch.empty(2, 5, 16, device="meta", requires_grad=True)
        return hooktrace.Target(model, x, optimizer=opt)

    return Factory("inline:make", make, "make()")


def test_every_hook_kind_fires_on_meta_in_the_order_the_hooks_record() -> None:
    zoo = Zoo()
    result = run(block_factory(zoo, []), RunOptions(device="meta", steps=2))
    for handle in zoo.handles:  # global hooks outlive the run
        handle.remove()
    assert result.exception is None, result.error
    trace = result.trace
    assert trace.meta.device == "meta" and trace.meta.dry_run and trace.meta.backward == "ran"
    assert node_and_saved_labels(zoo, trace) == zoo.log
    kinds = {e.kind for e in trace.events if e.type == "hook"}
    assert kinds >= {"forward_pre", "forward", "backward_pre", "backward", "grad", "post_accumulate_grad",
                     "node", "pack", "unpack", "optimizer_step_pre", "optimizer_step_post"}  # fmt: skip
    assert {e.step for e in trace.events} == {0, 1}
    # the same run untraced logs the same hooks in the same order
    untraced = Zoo()
    target = block_factory(untraced, []).func()
    for _ in range(2):
        target.model(target.inputs).sum().backward()
        target.optimizer.step()
        target.optimizer.zero_grad()
    for handle in untraced.handles:
        handle.remove()
    assert untraced.log == zoo.log


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_optimizer_flag_steps_meta_parameters(name: str) -> None:
    def make() -> Any:
        with torch.device("meta"):
            return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))

    seen: list[set[str]] = []

    def post(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        seen.append({p.device.type for g in opt.param_groups for p in g["params"]})
        seen.append({t.device.type for s in opt.state.values() for t in s.values() if t.dim()})

    handle = register_optimizer_step_post_hook(post)
    try:
        result = run(
            Factory("inline:make", make, "make()"), RunOptions(("4x8",), device="meta", optimizer=name)
        )
    finally:
        handle.remove()
    assert result.exception is None, result.error
    assert seen[0] == {"meta"} and seen[1] <= {"meta"}  # parameters and their state (Adam's moments)
    assert bool(seen[1]) == (name != "sgd")
    assert [e.kind for e in result.trace.events if e.type == "hook"] == ["optimizer_step_post"]


def test_a_fused_optimizer_on_meta_is_named() -> None:
    def make() -> Any:
        with torch.device("meta"):
            model = nn.Linear(8, 2)
        return hooktrace.Target(
            model, torch.empty(4, 8), optimizer=torch.optim.Adam(model.parameters(), fused=True)
        )

    result = run(Factory("inline:make", make, "make()"), RunOptions(device="meta"))
    assert isinstance(result.exception, RuntimeError)
    assert (
        "on meta, the optimizer's fused step does not run on meta (build it with fused=False)" in result.error
    )
    assert "the hook order up to it is shown" in result.error


def test_a_real_model_is_moved_and_generated_inputs_are_made_on_meta() -> None:
    devices: list[tuple[str, str]] = []

    def make() -> nn.Module:
        model = nn.Sequential(nn.Embedding(100, 8), nn.Linear(8, 4))
        model[1].register_forward_pre_hook(lambda m, a: devices.append((a[0].device.type, str(a[0].dtype))))
        return model

    factory = Factory("inline:make", make, "make()")
    # token ids: an int64 --input on meta holds no values, but Embedding only needs its shape
    result = run(factory, RunOptions(("1x16",), dtype="int64", device="meta"))
    assert result.exception is None, result.error
    assert devices == [("meta", "torch.float32")]
    assert result.trace.meta.device == "meta"
    assert not result.notes  # no hook or optimizer was left on the old parameters
    # the nearest case: the same factory on cpu is not a dry run
    cpu = run(factory, RunOptions(("1x16",), dtype="int64", device="cpu"))
    assert cpu.trace.meta.device == "cpu" and not cpu.trace.meta.dry_run


def test_a_huge_generated_input_costs_nothing_on_meta() -> None:
    def make() -> nn.Module:
        return nn.Linear(4096, 8)

    # 2**31 floats would be 8 GB on cpu; on meta it is a shape
    result = run(Factory("inline:make", make, "make()"), RunOptions(("524288x4096",), device="meta"))
    assert result.exception is None, result.error


def test_moving_to_meta_says_what_stays_on_the_old_parameters() -> None:
    def make() -> Any:
        model = nn.Linear(4, 2)
        model.weight.register_hook(lambda g: None)
        return hooktrace.Target(
            model, torch.ones(3, 4), optimizer=torch.optim.SGD(model.parameters(), lr=0.1)
        )

    result = run(Factory("inline:make", make, "make()"), RunOptions(device="meta"))
    assert result.exception is None, result.error
    notes = "\n".join(result.notes)
    assert "1 hook(s) the factory registered on parameters stay on the old ones" in notes
    assert "the factory's optimizer holds the old ones" in notes
    # --optimizer makes one over the moved parameters: nothing to say about the optimizer
    result = run(Factory("inline:make", make, "make()"), RunOptions(device="meta", optimizer="sgd"))
    assert "optimizer holds the old ones" not in "\n".join(result.notes)


# -- hooks and ops that need values ---------------------------------------------------------------

DATA_HOOKS = {
    "item": "o.sum().item()",
    "tolist": "o.tolist()",
    "if": "1 if o.sum() > 0 else 0",
    "isfinite_all": "bool(torch.isfinite(o).all())",
    "numpy": "o.detach().numpy()",
}


@pytest.mark.parametrize("body", DATA_HOOKS.values(), ids=DATA_HOOKS.keys())
def test_a_hook_that_needs_values_exits_1_with_the_partial_trace(tmp_path: Path, body: str) -> None:
    target = write(
        tmp_path / "needs_data.py",
        f"""
        import torch
        from torch import nn

        def make():
            with torch.device("meta"):
                model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
            model[0].register_forward_hook(lambda m, i, o: None)
            model[2].register_forward_hook(lambda m, i, o: {body})
            return model
        """,
    )
    code, out, err = invoke("run", f"{target}:make", "--device", "meta", "--input", "4x8")
    assert code == 1, err
    assert "this hook needs real data, which a dry run on meta does not have" in err
    assert "the hook order up to it is shown" in err
    assert "needs_data.py:9 in <lambda>" in err  # the hook's own line
    assert "#2 forward" in out and "[error]" in out  # the order up to it: the first hook, then this one
    assert DRY_RUN_NOTE in out


def test_printing_a_meta_tensor_in_a_hook_needs_no_values() -> None:
    printed: list[str] = []

    def make() -> nn.Module:
        with torch.device("meta"):
            model = nn.Linear(8, 2)
        model.register_forward_hook(lambda m, i, o: printed.append(str(o)))
        return model

    result = run(Factory("inline:make", make, "make()"), RunOptions(("4x8",), device="meta"))
    assert result.exception is None, result.error
    assert printed and "device='meta'" in printed[0]


def test_a_hook_raising_for_its_own_reasons_on_meta_is_not_blamed_on_meta() -> None:
    def make() -> nn.Module:
        with torch.device("meta"):
            model = nn.Linear(8, 2)
        model.register_forward_hook(lambda m, i, o: int("not a number"))
        return model

    result = run(Factory("inline:make", make, "make()"), RunOptions(("4x8",), device="meta"))
    assert isinstance(result.exception, ValueError)
    assert "needs real data" not in result.error and "on meta" not in result.error


def test_an_op_in_the_model_that_needs_values_is_named_with_its_line(tmp_path: Path) -> None:
    target = write(
        tmp_path / "masked.py",
        """
        import torch
        from torch import nn

        class Masked(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(8, 8)

            def forward(self, x):
                y = self.proj(x)
                return y[y > 0].sum()

        def make():
            with torch.device("meta"):
                model = Masked()
            model.proj.register_forward_hook(lambda m, i, o: None)
            return model
        """,
    )
    code, out, err = invoke("run", f"{target}:make", "--device", "meta", "--input", "4x8")
    assert code == 1, err  # not exit 2: the --input shape was fine, meta has no values
    assert "the root module raised NotImplementedError" in err
    assert "on meta, torch.nonzero() needs real data (at " in err
    assert "masked.py:12 in forward `return y[y > 0].sum()`" in err
    assert "#2 forward" in out


def test_meta_failure_names_what_meta_cannot_do() -> None:
    x = torch.empty(3, device="meta")
    cases = {
        "Tensor.item()": lambda: x.sum().item(),
        "a copy of values out of a meta tensor": lambda: x.tolist(),
        "torch.nonzero()": lambda: x.nonzero(),
        "aten::_unique2": lambda: torch.unique(x),
    }
    for op, fn in cases.items():
        with pytest.raises(Exception) as info:
            fn()
        failure = meta_failure(info.value)
        assert failure is not None and failure.op == op, (op, info.value)
        assert failure.where is not None and "test_meta.py" in failure.where
    assert meta_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
    assert meta_failure(ValueError("Tensor.item() cannot be called on meta tensors")) is None


# -- exit 2 -------------------------------------------------------------------------------------


def test_an_all_meta_model_without_device_meta_exits_2_with_the_hint(tmp_path: Path) -> None:
    target = write(
        tmp_path / "on_meta.py",
        """
        import torch
        from torch import nn

        def make():
            with torch.device("meta"):
                return nn.Linear(4, 2)
        """,
    )
    code, out, err = invoke("run", f"{target}:make", "--input", "3x4")
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert "all on the meta device" in err and "add --device meta for a dry run" in err
    code, out, err = invoke("run", f"{target}:make", "--input", "3x4", "--device", "cpu")
    assert code == 2 and "use --device meta for a dry run" in err
    code, out, err = invoke("run", f"{target}:make", "--input", "3x4", "--device", "meta")
    assert code == 0, err


def test_unknown_devices_name_meta_among_the_choices() -> None:
    with pytest.raises(UsageError, match="use cpu, cuda, cuda:N, auto or meta"):
        RunOptions(device="tpu").check()
    RunOptions(device="meta").check()
    RunOptions(device="META").check()


# -- renderings ---------------------------------------------------------------------------------


def small_trace(device: str) -> Any:
    def make() -> nn.Module:
        with torch.device(device):
            model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        model[0].register_forward_hook(lambda m, i, o: None)
        return model

    result = run(Factory("inline:make", make, "make()"), RunOptions(("2x4",), device=device))
    assert result.exception is None
    return result.trace


def test_every_rendering_says_once_that_it_is_a_dry_run(tmp_path: Path) -> None:
    trace = small_trace("meta")
    assert tree_text(trace, width=80).count(DRY_RUN_NOTE) == 1
    assert render(trace, "dot").count(DRY_RUN_NOTE) == 1
    chrome = json.loads(render(trace, "chrome"))
    assert chrome["otherData"]["dry_run"] == DRY_RUN_NOTE
    assert chrome["traceEvents"][0]["args"]["name"].endswith("(dry run on meta)")
    html = render(trace, "html")
    assert html.count(DRY_RUN_NOTE) == 1 and "m.dryRun" in html
    # a saved trace renders the same (renderings read only the trace)
    path = tmp_path / "dry.json"
    trace.save(path)
    code, out, err = invoke("render", str(path))
    assert code == 0 and out.count(DRY_RUN_NOTE) == 1
    code, out, err = invoke("render", str(path), "-o", str(tmp_path / "dry.txt"))
    assert code == 0 and "dry run on meta: shapes only, no values" in err
    # the nearest case: on cpu, nothing says so
    cpu = small_trace("cpu")
    for text in (tree_text(cpu, width=80), render(cpu, "dot"), render(cpu, "chrome"), render(cpu, "html")):
        assert "dry run" not in text


def test_trace_api_on_a_meta_model_is_a_dry_run_but_an_offloaded_one_is_not() -> None:
    with torch.device("meta"):
        model = nn.Linear(4, 2)
    with hooktrace.trace(model) as t:
        model(torch.empty(3, 4, device="meta"))
    assert t.trace.meta.device == "meta" and t.trace.meta.dry_run
    # offloaded: the first parameter is on meta, the others hold data
    offloaded = nn.Sequential(nn.Linear(4, 4, device="meta"), nn.Linear(4, 2))
    offloaded[0].forward = lambda x: torch.zeros(x.shape[0], 4)
    with hooktrace.trace(offloaded) as t:
        offloaded(torch.ones(3, 4))
    assert t.trace.meta.device == "cpu" and not t.trace.meta.dry_run


# -- exec: a script that builds its model on meta -------------------------------------------------


def test_exec_traces_a_script_that_builds_its_model_on_meta(tmp_path: Path, monkeypatch: Any) -> None:
    log = tmp_path / "log.txt"
    script = write(
        tmp_path / "train_meta.py",
        f"""
        import torch
        from torch import nn

        class LOG:
            @staticmethod
            def append(label):
                with open({str(log)!r}, "a") as f:
                    f.write(label + " ")

        with torch.device("meta"):
            model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        model[0].register_forward_hook(lambda m, i, o: LOG.append("0.forward"))
        model[2].register_full_backward_hook(lambda m, gi, go: LOG.append("2.backward"))
        opt = torch.optim.AdamW(model.parameters())
        opt.register_step_post_hook(lambda o, a, k: LOG.append("step_post"))
        for step in range(2):
            model(torch.empty(8, 16, device="meta")).sum().backward()
            opt.step()
            opt.zero_grad()
        """,
    )
    monkeypatch.setattr(sys, "argv", ["hooktrace"])
    monkeypatch.setattr(sys, "path", list(sys.path))
    out_json = tmp_path / "t.json"
    code, out, err = invoke("exec", "-o", str(out_json), "--steps", "2", str(script))
    assert code == 0, err
    trace = hooktrace.load(out_json)
    assert trace.meta.device == "meta"
    assert "dry run on meta" in err
    names = {"0": "0.forward", "2": "2.backward"}
    traced = [names.get(e.module, "step_post") for e in trace.events if e.type == "hook"]
    assert traced == log.read_text().split() and len(traced) == 6  # two steps


def test_shapes_on_meta_are_the_shapes_each_hook_received(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    def dims(*tensors: Any) -> list[str]:
        return ["[" + ",".join(map(str, t.shape)) + "]" for t in tensors if isinstance(t, torch.Tensor)]

    def make() -> nn.Module:
        with torch.device("meta"):
            model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
        model[0].register_forward_pre_hook(lambda m, a: seen.append(dims(*a)))
        model[0].register_forward_hook(lambda m, a, o: seen.append(dims(*a, o)))
        model[2].register_full_backward_hook(lambda m, gi, go: seen.append(dims(*gi, *go)))
        return model

    result = run(Factory("inline:make", make, "make()"), RunOptions(("8x16",), device="meta", shapes=True))
    assert result.exception is None, result.error
    events = [e for e in result.trace.events if e.type == "hook"]
    assert len(events) == len(seen) == 3
    for event, dims_seen in zip(events, seen):
        assert event.shapes is not None and "meta" in event.shapes and "cpu" not in event.shapes
        found = re.findall(r"\[[\d,]*\]", event.shapes)
        assert found == dims_seen, (event.shapes, dims_seen)
    path = tmp_path / "shapes.json"
    result.trace.save(path)
    code, out, err = invoke("render", str(path))
    assert code == 0 and "(f32[8,16] meta,), f32[8,32] meta" in out and DRY_RUN_NOTE in out


RANKS_ON_META = """
import os

import torch
from torch import nn


def log(name):
    with open(f"{os.environ['META_RANKS_LOG']}.rank{os.environ['RANK']}", "a") as f:
        f.write(name + "\\n")


def first_pre(module, args):
    log("first_pre")


def last_backward(module, grad_input, grad_output):
    log("last_backward")


def weight_ready(param):
    log("weight_ready")


def make():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    model[0].register_forward_pre_hook(first_pre)
    model[2].register_full_backward_hook(last_backward)
    model[0].weight.register_post_accumulate_grad_hook(weight_ready)
    return model
"""


@pytest.mark.slow
def test_nproc_ranks_each_run_dry_on_meta_with_shapes(tmp_path: Path) -> None:
    import os
    import subprocess

    factory = tmp_path / "ranks_meta.py"
    factory.write_text(RANKS_ON_META)
    log = tmp_path / "hooks.log"
    done = subprocess.run(
        [sys.executable, "-m", "hooktrace", "run", str(factory), "--nproc", "2", "--device", "meta",
         "--input", "4x8", "--shapes", "-o", str(tmp_path / "m.json")],
        env=dict(os.environ, META_RANKS_LOG=str(log)), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ranks agree" in done.stdout
    for rank in range(2):
        trace = hooktrace.load(tmp_path / f"m.rank{rank}.json")
        assert trace.meta.dry_run and trace.meta.rank == rank
        names = [trace.hook(e.hook).name for e in trace.hook_events()]
        assert names == Path(f"{log}.rank{rank}").read_text().split()  # the hooks' own record
        assert len(names) == 3
        assert [e.shapes for e in trace.hook_events()][0] == "(f32[4,8] meta,)"


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_device_on_a_factory_returning_a_compiled_model(tmp_path, device):
    """`torch.compile(model)`'s wrapper is moved without a truth test: `bool()` on it calls the module's
    `__len__` (Linear has none: 'Linear does not support len()')."""
    factory = write(
        tmp_path / "compiled.py",
        """
        import torch
        from torch import nn

        LOG = []

        def make():
            m = nn.Linear(4, 2)
            m.register_forward_hook(lambda mod, i, o: LOG.append("fwd"))
            return torch.compile(m, backend="eager")
        """,
    )
    out = tmp_path / "t.json"
    code, _, err = invoke("run", f"{factory}:make", "--input", "3,4", "--device", device, "-o", str(out))
    assert code == 0, err
    trace = hooktrace.load(out)
    assert [h.kind for h in trace.hooks] == ["forward"] and trace.meta.device == device
    assert [e.module for e in trace.events if e.type == "enter"] == [""]  # the model ran, once
