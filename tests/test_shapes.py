"""`--shapes` (docs/format.md's optional `shapes` column): what each hook received and returned.

The oracle: every hook records the tensors it was given and what it returns (dtype, shape, device,
or None, flattened in order), with the test's own names for dtypes; hooktrace's text for that call
is read back into the same list and compared. Then: the exact text of a few calls (the structure),
the column on save/load and what validation refuses, the CLI flag of `run` and `exec`, the rest of
the tensor zoo (meta, FakeTensor, DTensor, sparse, nested, subclasses), and transparency.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import torch
import torch.nn.modules.module as nn_module
from torch import nn

import hooktrace
from hooktrace import TraceFormatError
from hooktrace.capture import shapes as describe
from hooktrace.cli import main
from hooktrace.validate import from_dict

from .global_hooks import global_module_hooks_kept

pytest_plugins = ["pytester"]

# The test's own dtype words (not hooktrace's table).
CODES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.bool: "bool",
    torch.complex64: "c64",
}
Item = Any  # None, or (dtype word, shape, device)


def flat(obj: Any) -> list[Item]:
    """The tensors and Nones in `obj`, in order (tuples, lists and dict values opened)."""
    if obj is None:
        return [None]
    if isinstance(obj, torch.Tensor):
        return [(CODES[obj.dtype], tuple(obj.shape), str(obj.device))]
    if isinstance(obj, (tuple, list)):
        return [x for o in obj for x in flat(o)]
    if isinstance(obj, dict):
        return [x for o in obj.values() for x in flat(o)]
    return []


_ITEM = re.compile(r"None|([a-z0-9_]+)\[([0-9,]*)\] ([a-z]+(?::[0-9]+)?)")


def parsed(text: str) -> list[Item]:
    """hooktrace's text read back into `flat`'s items (type names of other objects skipped)."""
    out: list[Item] = []
    for m in _ITEM.finditer(text):
        if m.group(0) == "None":
            out.append(None)
        else:
            sizes = tuple(int(s) for s in m.group(2).split(",") if s)
            out.append((m.group(1), sizes, m.group(3)))
    return out


class Seen:
    """Hooks that record what they received and what they return, by label, in call order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, list[Item], Optional[list[Item]]]] = []

    def hook(self, label: str, owner_first: bool, returns: Optional[Callable[..., Any]] = None) -> Any:
        def fn(*args: Any, **kwargs: Any) -> Any:
            given = args[1:] if owner_first else args
            result = returns(*args) if returns is not None else None
            self.log.append(
                (label, flat(list(given) + list(kwargs.values())), None if result is None else flat(result))
            )
            return result

        fn.__qualname__ = label
        return fn


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(
        self, x: torch.Tensor, mask: Optional[torch.Tensor] = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.fc(x)
        return y * mask.unsqueeze(-1), mask.long().sum(-1)  # a tuple: a float tensor and an int one


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, count = self.inner(x, mask=mask)
        return self.head(a), count


def _model() -> tuple[Model, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return Model(), torch.randn(8, 16), torch.rand(8) > 0.3


def _register(seen: Seen, model: Model, opt: torch.optim.Optimizer) -> list[Any]:
    """One hook of every kind that fires in a training step; their handles."""
    h = seen.hook
    inner, fc, head = model.inner, model.inner.fc, model.head
    out = [
        nn_module.register_module_forward_pre_hook(h("global_forward_pre", True)),
        nn_module.register_module_forward_hook(h("global_forward", True)),
        nn_module.register_module_full_backward_pre_hook(h("global_backward_pre", True)),
        nn_module.register_module_full_backward_hook(h("global_backward", True)),
        model.register_forward_pre_hook(h("root_forward_pre_kwargs", True), with_kwargs=True),
        model.register_forward_hook(h("root_forward_kwargs", True), with_kwargs=True),
        inner.register_forward_pre_hook(h("inner_forward_pre", True)),
        inner.register_forward_hook(h("inner_forward", True)),  # receives a tuple output
        inner.register_full_backward_pre_hook(h("inner_backward_pre", True)),  # grad_output holds None
        inner.register_full_backward_hook(h("inner_backward", True)),
        fc.register_full_backward_hook(h("fc_backward", True)),  # grad_input is (None,): x needs no grad
        head.register_forward_hook(h("head_forward_returns", True, lambda m, a, o: o * 1.0)),
        head.register_backward_hook(h("head_backward_legacy", True)),
        fc.weight.register_hook(h("weight_grad_returns", False, lambda g: g * 1.0)),
        fc.weight.register_post_accumulate_grad_hook(h("weight_post_accumulate", False)),
        opt.register_step_pre_hook(h("step_pre", True)),
        opt.register_step_post_hook(h("step_post", True)),
    ]
    return out


def _step(seen: Seen, model: Model, x: torch.Tensor, mask: torch.Tensor, opt: torch.optim.Optimizer) -> Any:
    h = seen.hook

    def on_output(module: nn.Module, args: tuple, output: torch.Tensor) -> None:  # hooks on the output
        output.register_hook(h("output_grad", False))
        output.grad_fn.register_prehook(h("node_pre", False))
        output.grad_fn.register_hook(h("node", False))

    handle = model.head.register_forward_hook(on_output)
    try:
        with torch.autograd.graph.saved_tensors_hooks(
            h("pack", False, lambda t: t), h("unpack", False, lambda t: t)
        ):
            out, count = model(x, mask=mask)
        out.sum().backward()
        opt.step()
        opt.zero_grad()
    finally:
        handle.remove()
    return out, count


def _traced(shapes: bool = True) -> tuple[Seen, Any, Any]:
    seen = Seen()
    model, x, mask = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handles = _register(seen, model, opt)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the legacy backward hook's own warning
            with hooktrace.trace(model, shapes=shapes) as t:
                result = _step(seen, model, x, mask, opt)
    finally:
        for handle in handles:
            handle.remove()
    return seen, t, (result, model)


@pytest.fixture(scope="module")
def traced() -> tuple[Seen, Any]:
    # set up before the per-test restore begins: a global full backward hook's flag would outlive it
    with global_module_hooks_kept():
        seen, t, _ = _traced()
    return seen, t.trace


def test_every_hook_call_has_the_shapes_its_hook_saw(traced) -> None:
    seen, trace = traced
    events = [
        e for e in trace.hook_events() if trace.hook(e.hook).name in {label for label, _, _ in seen.log}
    ]
    assert [trace.hook(e.hook).name for e in events] == [label for label, _, _ in seen.log]
    for e, (label, received, returned) in zip(events, seen.log):
        got, _, gave = e.shapes.partition(" -> ")
        assert parsed(got) == received, (label, e.shapes)
        assert (parsed(gave) if gave else None) == returned, (label, e.shapes)
    kinds = {e.kind for e in events}
    assert kinds >= {
        "forward_pre", "forward", "backward_pre", "backward", "backward_legacy", "grad",
        "post_accumulate_grad", "node_pre", "node", "pack", "unpack", "optimizer_step_pre",
        "optimizer_step_post",
    }  # fmt: skip


def test_every_hook_event_has_shapes_and_no_module_call_has(traced) -> None:
    _, trace = traced
    assert all(e.shapes for e in trace.events if e.type == "hook")
    assert all(e.shapes is None for e in trace.events if e.type != "hook")


def _first(trace: Any, name: str) -> str:
    return next(e.shapes for e in trace.hook_events() if trace.hook(e.hook).name == name)


@pytest.mark.parametrize(
    "name, text",
    [
        ("root_forward_pre_kwargs", "(f32[8,16] cpu,), {mask: bool[8] cpu}"),
        ("inner_forward_pre", "(f32[8,16] cpu,)"),  # mask came as a keyword: not in args
        ("inner_forward", "(f32[8,16] cpu,), (f32[8,4] cpu, i64[] cpu)"),
        ("root_forward_kwargs", "(f32[8,16] cpu,), {mask: bool[8] cpu}, (f32[8,2] cpu, i64[] cpu)"),
        ("head_forward_returns", "(f32[8,4] cpu,), f32[8,2] cpu -> f32[8,2] cpu"),
        ("inner_backward_pre", "(f32[8,4] cpu, None)"),
        ("fc_backward", "(None,), (f32[8,4] cpu,)"),
        ("weight_grad_returns", "f32[4,16] cpu -> f32[4,16] cpu"),
        ("weight_post_accumulate", "f32[4,16] cpu"),
        ("step_pre", "(SGD,), {}"),  # PyTorch passes step()'s own args, the optimizer first
    ],
)
def test_the_text_keeps_the_structure(traced, name: str, text: str) -> None:
    _, trace = traced
    assert _first(trace, name) == text


def test_saved_and_loaded_the_column_comes_back(traced, tmp_path: Path) -> None:
    _, trace = traced
    path = tmp_path / "t.json"
    trace.save(path)
    data = json.loads(path.read_text())
    columns, tables = data["events"]["columns"], data["events"]["tables"]
    assert len(columns["shapes"]) == data["events"]["count"]
    assert tables["shapes"] == sorted({e.shapes for e in trace.events} - {None})
    assert hooktrace.load(path).events == trace.events
    assert from_dict(trace.to_dict()).events == trace.events


def test_off_by_default_no_column_and_nothing_recorded() -> None:
    seen, t, _ = _traced(shapes=False)
    assert all(e.shapes is None for e in t.trace.events)
    assert "shapes" not in t.to_dict()["events"]["columns"]
    assert "shapes" not in t.to_dict()["events"]["tables"]


def test_the_shim_without_shapes_is_the_same_code_as_before() -> None:
    """Off: the shims have no shapes lines at all (chosen when the Recorder is made), not a test per call."""
    from hooktrace.capture import shims

    plain, traced = shims.Recorder(False), shims.Recorder(True)
    for arity in plain._factories:
        off = plain._factories[arity](print, 1, None, False, None, "grad").__code__
        on = traced._factories[arity](print, 1, None, False, None, "grad").__code__
        assert "note" not in off.co_names and not any(n.startswith("describe") for n in off.co_names)
        assert "note" in on.co_names
        assert off.co_filename.startswith("<hooktrace-shim") and "shapes" not in off.co_filename


def test_same_results_and_order_with_and_without_shapes() -> None:
    seen_on, on, (result_on, model_on) = _traced(shapes=True)
    seen_off, off, (result_off, model_off) = _traced(shapes=False)
    assert seen_on.log == seen_off.log  # every hook saw the same things, in the same order
    for a, b in zip(result_on, result_off):
        assert torch.equal(a, b)
    for (name, p), q in zip(model_on.named_parameters(), model_off.parameters()):
        assert torch.equal(p, q), name

    def plain(t: Any) -> list:
        names = {h.id: h.name for h in t.trace.hooks}
        return [(e.type, e.kind, e.module, e.phase, names.get(e.hook), e.returned) for e in t.trace.events]

    assert plain(on) == plain(off)


# -- the file format -------------------------------------------------------------------------------
def _doc(traced) -> dict:
    return traced[1].to_dict()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda ev: ev["columns"]["shapes"].__setitem__(1, 10**6), "outside its table"),
        (lambda ev: ev["columns"]["shapes"].__setitem__(1, "f32[1] cpu"), "indices into its table"),
        (lambda ev: ev["columns"]["shapes"].__setitem__(1, True), "indices into its table"),
        (lambda ev: ev["columns"]["shapes"].pop(), '"shapes" must be a list of'),
        (lambda ev: ev["columns"].__setitem__("shapes", {}), '"shapes" must be a list of'),
        (lambda ev: ev["tables"].pop("shapes"), "tables"),
        (lambda ev: ev["tables"]["shapes"].__setitem__(0, 7), "expected strings"),
        (lambda ev: ev["tables"]["shapes"].append(ev["tables"]["shapes"][0]), "repeats"),
        (lambda ev: ev["columns"]["shapes"].__setitem__(0, 0), "not a hook call"),  # event 0 is an enter
    ],
)
def test_validation_refuses_a_bad_shapes_column(traced, change: Callable, message: str) -> None:
    doc = _doc(traced)
    assert doc["events"]["columns"]["type"][0] == doc["events"]["tables"]["type"].index("enter")
    change(doc["events"])
    with pytest.raises(TraceFormatError, match=message):
        from_dict(doc)


def test_a_file_without_the_column_loads_and_unknown_columns_are_ignored(traced) -> None:
    doc = _doc(traced)
    del doc["events"]["columns"]["shapes"], doc["events"]["tables"]["shapes"]
    doc["events"]["columns"]["future"] = ["anything"] * doc["events"]["count"]
    doc["events"]["tables"]["future"] = {"not": "a list"}
    loaded = from_dict(doc)
    assert [e._replace(shapes=None) for e in traced[1].events] == loaded.events


# -- renderings ------------------------------------------------------------------------------------
def test_the_tree_shows_them_under_each_hook_within_80_columns(traced) -> None:
    from hooktrace.render.tree import tree_text

    text = tree_text(traced[1], width=80)
    assert "(f32[8,16] cpu,), {mask: bool[8] cpu}" in text
    assert max(map(len, text.splitlines())) <= 80
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if "fc_backward" in line)
    assert "(None,), (f32[8,4] cpu,)" in "\n".join(lines[at + 1 : at + 3])


def test_a_long_kwargs_dict_wraps_inside_at_80_columns() -> None:
    from hooktrace.render.tree import tree_text

    lin = nn.Linear(3, 3)
    lin.register_forward_pre_hook(lambda m, args, kwargs: None, with_kwargs=True)
    lin.forward = lambda x, **kw: x  # noqa: E731 - a forward that takes keywords
    named = {f"argument_number_{i}": torch.zeros(2, 3) for i in range(6)}
    with hooktrace.trace(lin, shapes=True) as t:
        lin(torch.zeros(2, 3), **named)
    lines = tree_text(t, width=80).splitlines()
    at = next(i for i, line in enumerate(lines) if "forward_pre" in line)
    below = [line for line in lines[at + 1 :] if "argument_number_" in line]
    assert len(below) >= 3 and max(map(len, lines)) <= 80
    starts = {len(line) - len(line.lstrip(" │├└─")) for line in below}
    assert len(starts) == 1, below  # every wrapped line indented alike


def test_a_long_text_wraps_between_arguments_at_80_columns() -> None:
    from hooktrace.render.tree import tree_text

    seen = Seen()
    lin = nn.Linear(3, 3)
    lin.register_forward_pre_hook(seen.hook("many", True))
    xs = [torch.randn(2, 3)] * 9
    with hooktrace.trace(shapes=True) as t:
        lin(xs[0])
        many = nn.Module()
        many.forward = lambda *a: a[0]  # a forward wrapper that receives nine tensors
        many(*xs)
    text = tree_text(t, width=80)
    assert max(map(len, text.splitlines())) <= 80
    assert "f32[2,3] cpu, f32[2,3] cpu" in text and "…" not in text  # positional args are not elided
    wrapper = next(e.shapes for e in t.trace.hook_events() if e.kind == "forward_wrapper")
    assert wrapper == ", ".join(["f32[2,3] cpu"] * 9) + " -> f32[2,3] cpu"


def test_order_files_never_hold_shapes(traced) -> None:
    from hooktrace.render.order import order_text

    assert "f32" not in order_text(traced[1]) and "cpu" not in order_text(traced[1])


def test_chrome_trace_events_carry_them_in_their_args(traced) -> None:
    from hooktrace.render.chrome import chrome_trace

    _, trace = traced
    hooks = [e for e in chrome_trace(trace)["traceEvents"] if e.get("ph") == "X" and "hook" in e["args"]]
    assert hooks and all(e["args"]["shapes"] == trace.events[e["args"]["seq"]].shapes for e in hooks)


def test_the_html_report_carries_them_for_the_details_pane(traced) -> None:
    from hooktrace.render.html import html_report

    page = html_report(traced[1])
    assert "(f32[8,16] cpu,), {mask: bool[8] cpu}" in page
    assert 'row("shapes"' in page


# -- the CLI ---------------------------------------------------------------------------------------
FACTORY = """
import torch
from torch import nn

def make():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 4), nn.ReLU())
    model[0].register_forward_hook(lambda m, args, out: None)
    return model, torch.randn(8, 16)
"""
SCRIPT = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(16, 4), nn.ReLU())
model[0].register_forward_hook(lambda m, args, out: None)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
"""


def _columns(path: Path) -> dict:
    return json.loads(path.read_text())["events"]["columns"]


def test_run_shapes_flag(tmp_path: Path, capsys) -> None:
    factory = tmp_path / "m.py"
    factory.write_text(FACTORY)
    assert main(["run", f"{factory}:make", "--shapes", "-o", str(tmp_path / "a.json")]) == 0
    assert main(["run", f"{factory}:make", "-o", str(tmp_path / "b.json")]) == 0
    with_shapes = hooktrace.load(tmp_path / "a.json")
    assert [e.shapes for e in with_shapes.hook_events()] == ["(f32[8,16] cpu,), f32[8,4] cpu"]
    assert "shapes" not in _columns(tmp_path / "b.json")
    capsys.readouterr()
    assert main(["run", f"{factory}:make", "--shapes"]) == 0
    assert "(f32[8,16] cpu,), f32[8,4] cpu" in capsys.readouterr().out


def test_exec_shapes_flag(tmp_path: Path, monkeypatch) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    monkeypatch.setattr("sys.argv", ["hooktrace"])
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    assert main(["exec", "--shapes", "-o", str(tmp_path / "a.json"), str(script)]) == 0
    assert main(["exec", "-o", str(tmp_path / "b.json"), str(script)]) == 0
    assert [e.shapes for e in hooktrace.load(tmp_path / "a.json").hook_events()] == [
        "(f32[8,16] cpu,), f32[8,4] cpu"
    ]
    assert "shapes" not in _columns(tmp_path / "b.json")


def test_exec_nproc_passes_shapes_to_the_ranks(monkeypatch) -> None:
    import hooktrace.ranks as ranks
    from hooktrace.cli import main

    seen: list[Any] = []

    class Launched(Exception):
        pass

    def launch(job: Any, nproc: int, **_: Any) -> Any:
        seen.append(job.data()["options"])
        raise Launched

    monkeypatch.setattr(ranks, "run_ranks", launch)
    script = str(Path(__file__).parent / "scripts" / "loop.py")
    for shapes in (["--shapes"], []):
        main(["exec", "--nproc", "2", *shapes, script])  # the launch raised: nothing ran
    assert seen[0]["shapes"] is True and seen[1]["shapes"] is False


# -- what a tensor is described as ---------------------------------------------------------------------
class Logged(torch.Tensor):
    """A subclass whose __torch_function__ records every call: reading its metadata must not make one."""

    calls: list[Any] = []

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        cls.calls.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


class Broken(torch.Tensor):
    """A subclass whose metadata raises."""

    @property
    def shape(self) -> Any:  # type: ignore[override]
        raise RuntimeError("no shape")


def test_tensors_of_every_sort() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    value = describe.value
    assert value(torch.zeros(2, 3, device="meta")) == "f32[2,3] meta"
    assert value(torch.zeros((), dtype=torch.bfloat16)) == "bf16[] cpu"
    assert value(nn.Parameter(torch.zeros(4, dtype=torch.float64))) == "f64[4] cpu"
    assert value(torch.zeros(3, 4).to_sparse()) == "f32[3,4] sparse_coo cpu"
    with FakeTensorMode():
        fake = torch.empty(5, 7, dtype=torch.float16)
    assert value(fake) == "FakeTensor f16[5,7] cpu"
    jagged = torch.nested.nested_tensor([torch.zeros(2, 3), torch.zeros(4, 3)], layout=torch.jagged)
    assert re.fullmatch(r"NestedTensor f32\[2,j\d+,3\] jagged cpu", value(jagged))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the strided layout's prototype warning
        strided = torch.nested.nested_tensor([torch.zeros(2, 3), torch.zeros(4, 3)])
    assert value(strided) == "f32[nested] cpu"  # it has no sizes to read
    Logged.calls.clear()
    assert value(torch.zeros(2).as_subclass(Logged)) == "Logged f32[2] cpu"
    assert Logged.calls == []
    # its own `shape` property is the program's code, never called: the tensor's own metadata is read
    assert value(torch.zeros(2).as_subclass(Broken)) == "Broken f32[2] cpu"
    assert value(torch.zeros(2, dtype=torch.float8_e4m3fn)) == "f8_e4m3fn[2] cpu"


def test_containers_are_kept_short_and_names_safe() -> None:
    value = describe.value
    x = torch.zeros(1)
    assert value([x] * 10) == "[" + "f32[1] cpu, " * 8 + "…+2]"  # what a hook got itself: 8 items
    assert value(([x] * 6,)) == "([f32[1] cpu, f32[1] cpu, f32[1] cpu, f32[1] cpu, …+2],)"  # inside: 4
    assert value({"a": x, 3: None, "b": 1.5}) == "{a: f32[1] cpu, int: None, b: float}"
    assert value(((((x,),),),)) == "(((…),),)"  # a hook's argument is depth 1: three levels shown
    weird = type("Name\x1b[31m\u202e", (), {})()
    text = value({"key\x07\n": weird})
    assert text == "{key??: Name??31m?}"
    assert text.isprintable() and text.isascii()


def test_a_dtensor_shows_its_global_shape(gloo_one_rank) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    assert describe.value(distribute_tensor(torch.zeros(8, 4), mesh, [Shard(0)])) == "DTensor f32[8,4] cpu"
    assert describe.value(distribute_tensor(torch.zeros(2), mesh, [Replicate()])) == "DTensor f32[2] cpu"
    # a shard of 4 rows of a global 8 x 4 (as on rank 0 of two): the global shape, not the local one
    half = DTensor.from_local(
        torch.zeros(4, 4), mesh, [Shard(0)], run_check=False, shape=(8, 4), stride=(4, 1)
    )
    assert half.to_local().shape == (4, 4)
    assert describe.value(half) == "DTensor f32[8,4] cpu"


def test_hooks_of_a_model_on_meta() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(16, 4), nn.ReLU())
    seen = Seen()
    model[0].register_forward_hook(seen.hook("meta_forward", True))
    with hooktrace.trace(model, shapes=True) as t:
        model(torch.zeros(8, 16, device="meta"))
    assert [e.shapes for e in t.trace.hook_events()] == ["(f32[8,16] meta,), f32[8,4] meta"]
    assert parsed(t.trace.events[2].shapes) == seen.log[0][1]


def test_the_html_details_pane_shows_the_selected_calls_shapes(traced, tmp_path: Path) -> None:
    from hooktrace.render.html import html_report

    from . import browser

    page = tmp_path / "r.html"
    page.write_text(html_report(traced[1]), encoding="utf-8")
    for driver in browser.chromium():
        logs = browser.open_page(driver, page)
        assert [e for e in logs if e.get("level") in ("SEVERE", "ERROR")] == []
        from selenium.webdriver.support.ui import WebDriverWait

        driver.find_element("id", "search").send_keys("fc_backward")  # rows below the fold are not drawn
        WebDriverWait(driver, 10).until(
            lambda d: "1 matching hook call" in d.find_element("css selector", ".count").text
        )
        row = next(
            r
            for r in driver.find_elements("css selector", ".tree .row")
            if "#" in r.text and "fc_backward" in r.text
        )
        assert "(None,), (f32[8,4] cpu,)" in row.text  # the tree row shows them too
        row.click()
        details = driver.find_element("css selector", ".details").text
        assert "shapes (None,), (f32[8,4] cpu,)" in details
        driver.execute_script("document.querySelector('.details').scrollIntoView()")
        driver.save_screenshot(str(tmp_path / "details.png"))


def test_the_hook_order_fixture_takes_shapes_and_its_snapshot_holds_none(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_model="""
        import torch

        def test_model(hook_order):
            model = torch.nn.Linear(3, 2)
            model.register_forward_hook(lambda m, args, out: None)
            with hook_order(model, shapes=True) as session:
                model(torch.randn(4, 3))
            assert [e.shapes for e in session.trace.hook_events()] == ["(f32[4,3] cpu,), f32[4,2] cpu"]
        """
    )
    plugin = ("-p", "hooktrace.pytest_plugin")
    pytester.runpytest(*plugin, "--hooktrace-update").assert_outcomes(passed=1)
    snapshot = (pytester.path / "__hooktrace__/test_model/test_model.txt").read_text(encoding="utf-8")
    assert "forward" in snapshot and "f32" not in snapshot and "cpu" not in snapshot
    pytester.runpytest(*plugin).assert_outcomes(passed=1)


def test_a_file_s_hostile_shapes_text_reaches_no_terminal_raw(traced) -> None:
    """Texts made by hooktrace hold safe characters only; a file may hold anything: renderers escape it."""
    from hooktrace.render import render
    from hooktrace.render.tree import tree_text

    doc = _doc(traced)
    doc["events"]["tables"]["shapes"][0] = "f32[1] cpu\x1b[2J\x07\u202e -> \x1b]0;title\x07"
    trace = from_dict(doc)
    for text in (tree_text(trace, width=80), render(trace, "chrome"), render(trace, "html")):
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
