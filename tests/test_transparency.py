"""Transparency (docs/contract.md): the same code run untraced and traced sees no difference.

Each scenario runs twice from the same seed, once plain and once inside `hooktrace.trace()`, and
returns what its code observed (results, gradients, exceptions, what it found in the hook dicts by
identity and type). The two observations must be equal, the dicts must hold no hooktrace object
during and after the block, and the user's own hooks must be in the trace in the order they ran.
"""

from __future__ import annotations

import copy
import io
import sys
import threading
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.modules.module as nn_module
from torch import nn

import hooktrace
from tests.oracle import assert_no_shims, snapshot_dicts

LOG: list[str] = []


def logged_pre(module: nn.Module, args: tuple) -> None:  # module-level: picklable
    LOG.append("logged_pre")


def logged_fwd(module: nn.Module, args: tuple, output: Any) -> None:
    LOG.append("logged_fwd")


def logged_sd(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    LOG.append("logged_sd")


def no_hooktrace_objects(model: nn.Module) -> None:
    """No dict of the model (or the global ones) holds anything made by hooktrace."""
    for name, entries in snapshot_dicts(model).items():
        for _k, _i, value in entries:
            where = getattr(value, "__module__", "") or ""
            assert not where.startswith("hooktrace") and "<hooktrace" not in getattr(
                getattr(value, "__code__", None), "co_filename", ""
            ), f"{name} holds {value!r}"
    assert_no_shims(snapshot_dicts(model))


def both(scenario: Callable[[], Any]) -> tuple[Any, Any, hooktrace.Trace]:
    """(untraced observation, traced observation, trace), each run from seed 0 with a fresh LOG."""
    LOG.clear()
    torch.manual_seed(0)
    plain = _observe(scenario)
    plain_log = list(LOG)
    LOG.clear()
    torch.manual_seed(0)
    with hooktrace.trace() as t:
        traced = _observe(scenario)
    traced_log = list(LOG)
    assert plain_log == traced_log
    return (plain, plain_log), (traced, traced_log), t.trace


def _observe(scenario: Callable[[], Any]) -> Any:
    try:
        return ("ok", scenario())
    except Exception as exc:  # the same exception, with the same message, both ways
        return ("raised", type(exc).__name__, str(exc))


def fired(trace: hooktrace.Trace) -> list[str]:
    names = {h.id: h.name for h in trace.hooks}
    return [names[e.hook] for e in trace.events if e.type == "hook"]


def _tensors(*ts: torch.Tensor) -> list:
    return [t.detach().clone() for t in ts]


def _equal(a: Any, b: Any) -> None:
    """Deep equality where tensors must be bitwise equal."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _equal(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _equal(a[k], b[k])
    else:
        assert a == b


# -- pruning: finds its first hook by type --------------------------------------------------
def test_pruning_twice_is_pruned_and_remove() -> None:
    import torch.nn.utils.prune as prune

    def scenario() -> Any:
        m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
        m[0].register_forward_pre_hook(logged_pre)
        prune.l1_unstructured(m[0], "weight", amount=0.3)
        out1 = m(torch.randn(4, 8))
        prune.l1_unstructured(m[0], "weight", amount=0.3)  # iterative: finds the first by type
        kinds = [type(h).__name__ for h in m[0]._forward_pre_hooks.values()]
        pruned = prune.is_pruned(m)
        out2 = m(torch.randn(4, 8))
        out2.sum().backward()
        prune.remove(m[0], "weight")
        left = [type(h).__name__ for h in m[0]._forward_pre_hooks.values()]
        return _tensors(out1, out2, m[0].weight, m[2].weight.grad), kinds, pruned, left

    (plain, _), (traced, log), trace = both(scenario)
    _equal(plain, traced)
    assert plain[1][1] == ["function", "PruningContainer"] and plain[1][2] is True
    assert fired(trace).count("logged_pre") == log.count("logged_pre") == 2
    assert "PruningContainer" in fired(trace)


# -- weight norm / spectral norm and their removal ------------------------------------------
@pytest.mark.parametrize("which", ["weight_norm", "spectral_norm"])
def test_weight_and_spectral_norm_and_their_removal(which: str) -> None:
    add = getattr(nn.utils, which)
    remove = getattr(nn.utils, f"remove_{which}")

    def scenario() -> Any:
        lin = nn.Linear(6, 6)
        lin.register_forward_hook(logged_fwd)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            add(lin)
        out = lin(torch.randn(3, 6))
        out.sum().backward()
        found = [type(h).__name__ for h in lin._forward_pre_hooks.values()]
        remove(lin)
        return _tensors(out, lin.weight), found, list(lin._forward_pre_hooks), sorted(lin._parameters)

    (plain, _), (traced, _), trace = both(scenario)
    _equal(plain, traced)
    assert plain[1][1] in (["WeightNorm"], ["SpectralNorm"])
    assert fired(trace).count("logged_fwd") == 1


# -- eager quantization: convert finds observer hooks by identity, copies the others ---------
def test_quantization_prepare_calibrate_convert() -> None:
    import torch.ao.quantization as tq

    def scenario() -> Any:
        m = nn.Sequential(tq.QuantStub(), nn.Linear(4, 4), nn.ReLU(), tq.DeQuantStub())
        m.eval()
        m.qconfig = tq.get_default_qconfig("fbgemm")
        m[1].register_forward_hook(logged_fwd)
        tq.prepare(m, inplace=True)
        for _ in range(3):
            m(torch.randn(2, 4))
        tq.convert(m, inplace=True)
        out = m(torch.randn(2, 4))
        hooks = {
            path: [getattr(h, "__name__", type(h).__name__) for h in mod._forward_hooks.values()]
            for path, mod in m.named_modules()
        }
        return _tensors(out.dequantize() if out.is_quantized else out), hooks, type(m[1]).__name__

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's own deprecation warnings
        (plain, _), (traced, log), trace = both(scenario)
    _equal(plain, traced)
    assert plain[1][1]["1"] == ["logged_fwd"]  # convert copied the user's hook onto the quantized Linear
    assert fired(trace).count("logged_fwd") == log.count("logged_fwd") == 4


# -- torch.save and deepcopy of the model inside the block ----------------------------------
def test_torch_save_of_a_hooked_model_inside_the_block() -> None:
    def scenario() -> Any:
        m = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
        m[0].register_forward_pre_hook(logged_pre)
        m[0].register_state_dict_post_hook(logged_sd)
        m(torch.randn(2, 3))
        buf = io.BytesIO()
        torch.save(m, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        loaded(torch.randn(2, 3))
        return [h.__name__ for h in loaded[0]._forward_pre_hooks.values()], len(buf.getvalue()) > 0

    (plain, _), (traced, log), trace = both(scenario)
    assert plain == traced and plain[0] == "ok"
    assert fired(trace).count("logged_pre") == log.count("logged_pre") == 2


def test_deepcopy_inside_the_block_copies_no_hooktrace_object_and_its_hooks_are_told_apart() -> None:
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    m[0].register_forward_pre_hook(logged_pre)
    m[0].weight.register_hook(lambda g: g)
    with hooktrace.trace(m) as t:
        m(torch.randn(2, 3))
        twin = copy.deepcopy(m)
        twin(torch.randn(2, 3)).sum().backward()
        assert list(twin[0]._forward_pre_hooks.values()) == [logged_pre]
        no_hooktrace_objects(twin)
    no_hooktrace_objects(twin)
    no_hooktrace_objects(m)
    pre = [h for h in t.trace.hooks if h.name == "logged_pre"]
    assert len(pre) == 2 and len({h.id for h in pre}) == 2  # the copy's hook: same handle id, told apart
    assert sorted(e.hook for e in t.trace.events if e.type == "hook" and e.kind == "forward_pre") == sorted(
        h.id for h in pre
    )
    # a later trace names the copy's hook as the user's, not as a shim
    with hooktrace.trace(twin) as t2:
        twin(torch.randn(2, 3))
    assert [h.name for h in t2.trace.hooks if h.kind == "forward_pre"] == ["logged_pre"]


def test_a_shallow_copy_sharing_the_hook_dicts_records_each_module_its_own_calls() -> None:
    """`copy.copy(module)` shares the hook dicts: each module's events name that module."""
    seen: list[int] = []

    def who(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        seen.append(id(module))

    first = nn.Linear(3, 3)
    first.register_forward_hook(who)
    twin = copy.copy(first)
    assert twin._forward_hooks is first._forward_hooks
    m = nn.Sequential(first, twin, first)
    x = torch.randn(2, 3)
    plain = m(x)
    untraced_seen = seen[:]
    seen.clear()
    with hooktrace.trace(m) as t:
        traced_out = m(x)
    assert torch.equal(traced_out, plain) and seen == untraced_seen
    paths = {id(first): "0", id(twin): "1"}
    traced = [e.module for e in t.trace.events if e.type == "hook" and e.kind == "forward"]
    assert traced == [paths[i] for i in seen] == ["0", "1", "0"]
    assert twin._forward_hooks is first._forward_hooks and list(first._forward_hooks.values()) == [who]


# -- another tool that wraps the same dicts --------------------------------------------------
def test_another_tool_wrapping_the_dicts_inside_the_forward() -> None:
    """A TorchLens-like tool swaps every forward hook for its own wrapper during a call, then
    puts them back: each hook runs once, is recorded once, and the tool's wrappers do not stay."""

    def scenario() -> Any:
        m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
        m[0].register_forward_hook(logged_fwd)
        wrapped: list[str] = []

        def wrap_all(module: nn.Module, args: tuple) -> None:
            for hid, hook in list(module._forward_hooks.items()):

                def tool(mod: Any, a: Any, o: Any, hook: Any = hook) -> Any:
                    wrapped.append(getattr(hook, "__name__", "?"))
                    return hook(mod, a, o)

                tool.original = hook
                module._forward_hooks[hid] = tool

        def unwrap_all(module: nn.Module, args: tuple, out: Any) -> None:
            for hid, hook in list(module._forward_hooks.items()):
                if hasattr(hook, "original"):
                    module._forward_hooks[hid] = hook.original

        m[0].register_forward_pre_hook(wrap_all)
        out = m(torch.randn(2, 3))
        m[0].register_forward_hook(unwrap_all)
        out2 = m(torch.randn(2, 3))
        return (
            _tensors(out, out2),
            wrapped,
            [getattr(h, "__name__", "?") for h in m[0]._forward_hooks.values()],
        )

    (plain, _), (traced, log), trace = both(scenario)
    _equal(plain, traced)
    assert plain[1][2] == ["tool", "unwrap_all"]  # the tool's own wrapper stays after call 2 (its choice)
    assert log.count("logged_fwd") == 2
    # each call of the user's hook recorded once (through the tool's wrapper, under the hook's own id)
    assert fired(trace).count("logged_fwd") == 2


# -- torch.compile --------------------------------------------------------------------------
def test_torch_compile_fullgraph_with_hooks_is_unchanged_and_marked(no_global_hooks: None) -> None:
    torch._dynamo.reset()

    def make() -> nn.Module:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        m[0].register_forward_hook(lambda mod, a, o: o * 2)
        m[2].register_forward_pre_hook(lambda mod, a: (a[0] + 1,))
        return m

    def step(m: nn.Module) -> list:
        compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
        out = compiled(x)
        out.sum().backward()
        return _tensors(out, *(p.grad for p in m.parameters()))

    plain = step(make())
    torch._dynamo.reset()
    m = make()
    with hooktrace.trace(m) as t:
        traced = step(m)
    _equal(plain, traced)  # fullgraph=True compiled (it raises on a graph break) and bitwise equal
    no_hooktrace_objects(m)
    # torch 2.8's AOTAutograd also registers node hooks of its own while it traces the backward
    # (setup_stacktrace_preservation_hooks, in torch/_functorch): they run as Python and are traced
    users = [h.id for h in t.trace.hooks if not (h.defined_at or "").startswith("torch/")]
    assert len(users) == 2
    forward_hook = next(h.id for h in t.trace.hooks if h.id in users and h.kind == "forward")
    pre_hook = next(h.id for h in t.trace.hooks if h.id in users and h.kind == "forward_pre")
    ran = [e for e in t.trace.events if e.type == "hook" and e.hook in users]
    # they ran inside the graph: one event each, in program order, marked with the graph's number
    # and not as Python calls (no time of their own, nothing returned to observe)
    assert [e.hook for e in ran] == [forward_hook, pre_hook]
    assert [e.module for e in ran] == ["0", "2"]
    assert all(e.graph is not None and e.duration_ns == 0 and not e.returned for e in ran)
    runs = [e for e in t.trace.events if e.type == "graph"]
    assert len(runs) == 1 and runs[0].graph == ran[0].graph == ran[1].graph and runs[0].seq < ran[0].seq
    compiled = [s for s in t.trace.surprises if s.rule == "compiled" and set(s.hooks) & set(users)]
    assert not compiled  # the surprise names only hooks that ran nowhere
    never = [s for s in t.trace.surprises if s.rule == "never-fired" and set(s.hooks) & set(users)]
    assert not never  # they ran, inside the graph
    torch._dynamo.reset()


def test_a_hook_added_after_the_compile_runs_or_not_as_untraced(no_global_hooks: None) -> None:
    """pytorch/pytorch#117758: Dynamo calls a hookless module's forward without guarding its hook
    dicts, so a hook added after the compile never runs. Traced, the same graphs are compiled and the
    same hooks run (torch 2.14 inlined `_call_impl` under the capture's `__call__` and recompiled)."""

    def step() -> tuple[list[str], int, list]:
        torch._dynamo.reset()
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        ran: list[str] = []
        graphs: list[int] = []

        def backend(gm: torch.fx.GraphModule, inputs: list) -> Callable:
            graphs.append(len(gm.graph.nodes))
            return gm.forward

        compiled = torch.compile(m, backend=backend)
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
        first = compiled(x)
        m[0].register_forward_hook(lambda mod, a, o: ran.append("late") or o * 2)
        second = compiled(x)
        return ran, len(graphs), _tensors(first, second)

    plain = step()
    with hooktrace.trace():
        traced = step()
    assert traced[:2] == plain[:2]
    _equal(plain[2], traced[2])
    torch._dynamo.reset()


# -- threads calling the model while blocks open and close ----------------------------------
def test_threads_calling_the_model_while_blocks_end_leave_no_shim() -> None:
    m = nn.Sequential(*(nn.Linear(8, 8) for _ in range(4)))
    for i, layer in enumerate(m):
        layer.register_forward_pre_hook(lambda mod, a, i=i: None)
        layer.register_forward_hook(lambda mod, a, o, i=i: None)
    before = snapshot_dicts(m)
    stop = threading.Event()
    errors: list[BaseException] = []

    def worker() -> None:
        x = torch.randn(2, 8)
        try:
            while not stop.is_set():
                m(x)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=worker) for _ in range(3)]
    try:
        for th in threads:
            th.start()
        traces = []
        for _ in range(30):
            with hooktrace.trace(m) as t:
                m(torch.randn(2, 8))
            traces.append(t)
    finally:
        stop.set()
        for th in threads:
            th.join()
        sys.setswitchinterval(old)
    assert not errors
    assert snapshot_dicts(m) == before  # same ids, order and objects
    assert vars(nn.Module)["__call__"] is nn_module.Module._wrapped_call_impl
    n = len(traces[-1].trace.events)
    m(torch.randn(2, 8))  # nothing of the ended captures records any more
    assert len(traces[-1].trace.events) == n


# -- deep nesting costs no recursion depth ---------------------------------------------------
def test_deep_nesting_runs_traced_wherever_it_runs_untraced() -> None:
    class Nest(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x) + 1

    def build(depth: int) -> nn.Module:
        m: nn.Module = nn.Identity()
        for _ in range(depth):
            m = Nest(m)
            m.register_forward_hook(lambda mod, a, o: None)
        return m

    x = torch.zeros(1)
    deepest_plain = 0
    for depth in range(50, 1000, 5):  # as deep as this test's own stack lets the untraced model go
        try:
            build(depth)(x)
            deepest_plain = depth
        except RecursionError:
            break
    assert deepest_plain >= 100
    m = build(deepest_plain)
    with hooktrace.trace(m) as t:
        m(x)
    assert sum(e.type == "hook" for e in t.trace.events) == deepest_plain


def test_hook_registered_on_the_input_before_the_block_is_traced_and_restored() -> None:
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    x = torch.randn(2, 3, requires_grad=True)
    LOG.clear()

    def on_input_grad(grad: torch.Tensor) -> None:
        LOG.append("on_input_grad")

    x.register_hook(on_input_grad)
    before = snapshot_dicts(m, tensors=(x,))
    with hooktrace.trace(m) as t:
        m(x).sum().backward()
    assert LOG == ["on_input_grad"]
    assert snapshot_dicts(m, tensors=(x,)) == before
    (hook,) = [h for h in t.trace.hooks if h.name.endswith("on_input_grad")]
    assert hook.tensor == "input of <root>" and hook.scope == "tensor"
    assert [e.hook for e in t.trace.events if e.type == "hook"] == [hook.id]
    assert not [s for s in t.trace.surprises if hook.id in s.hooks and s.rule == "never-fired"]


def test_a_class_that_took_the_call_wrapper_during_the_block_is_plain_pytorch_after() -> None:
    """`torch._dynamo.disable(SomeModuleClass)` inside the block wraps whatever `__call__` is then:
    after the block that class must behave, and record, exactly as without hooktrace."""

    class Own(nn.Linear):
        pass

    m = Own(2, 2)
    m.register_forward_hook(logged_fwd)
    with hooktrace.trace(m) as t:
        Own.__call__ = Own.__call__  # a class keeps the wrapper it saw, as decorators do
        m(torch.randn(1, 2))
    n = len(t.trace.events)
    LOG.clear()
    with hooktrace.trace(m) as t2:
        m(torch.randn(1, 2))
    del Own.__call__
    assert LOG == ["logged_fwd"]
    assert n == 3 and len(t.trace.events) == 3  # nothing recorded into the ended capture
    assert [e.type for e in t2.trace.events] == ["enter", "hook", "exit"]  # handed to the new capture
    assert nn.Module.__call__.__name__ == "_wrapped_call_impl"
