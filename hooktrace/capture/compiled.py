"""Compiled autograd: which hooks ran inside its backward graph, and in what order.

Under compiled autograd (`torch._dynamo.compiled_autograd`), the backward pass is traced into an FX
graph that Dynamo compiles; each hook call is a `call_hook` node with its `hook_type` whose first
argument is `hooks[i]`, an index into the graph's `hooks` input. While Dynamo compiles that graph it
inlines the callables it finds there — hooktrace's shims among them (they stand in tensors' and
nodes' own hook dicts) — and a shim then calls the hook as plain code (shims.py, `compiling()`), so
the graph is what it is untraced. Those hooks then run inside the compiled graph: no Python call of
theirs can be seen. What can be read instead:

- `AutogradCompilerInstance.end_capture` builds the graph (after its `reorder_*` passes, which move
  hook nodes on purpose): the `call_hook` nodes in graph order are the order the hooks run in;
- the runtime wrapper it returns is called once per backward with the `hooks` list: `hooks[i]` is a
  shim (its hook id in its closure) or PyTorch's `BackwardHook` closure, whose `user_pre_hooks` /
  `user_hooks` hold the module's full backward hooks (shims too).

Each run is recorded through `Runs` (CURRENT.graph_runs of the capture open when it runs, so a
graph compiled during an earlier capture is traced too): its hooks become hook events of the trace
marked with the graph (capture/build.py); hooks of a run that still ran as Python (a graph break,
e.g. PyTorch's multi-grad inner hook, which Dynamo never traces) are traced by their shims as usual
and left out of the run's by the build.

Lazy and guarded: the patch is installed only when `torch._dynamo` is already imported when the
capture starts (an eager user never imports Dynamo because of hooktrace), and only on a torch whose
`end_capture` has the signature this reads; otherwise one note says the compiled-autograd hooks are
not traced, and the rest is.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Optional

import torch

from .. import kinds
from ..supported import release
from . import dynamo, hookapis, shims, sites
from .build import ONLY_AS_PYTHON
from .ledger import CURRENT, Ledger
from .ranges import graph_label
from .views import _is_compiling

# One run of a compiled graph: (enter seq, exit seq, thread, start and end perf_counter_ns, graph
# number, backward (compiled autograd's) or not, ((hook id, module key or None), ...) in the order
# the graph runs them, the error it raised or None)
Run = tuple[int, int, int, int, int, int, bool, tuple[tuple[int, Optional[int]], ...], Optional[str]]
# (hook id, weak reference to the module it is called for, or None), as compiled into a graph
Compiled = tuple[tuple[int, Any], ...]
_NUMBERS = itertools.count(1)  # the graphs hooktrace saw compiled, numbered in the process
# calls of the compiled-autograd graphs whose compile hooktrace saw (with hooks or without), in the
# process: a backward under compiled autograd that calls none of them ran a graph compiled before
_SEEN_BACKWARD_CALLS = [0]
# what `never-fired` says of a backward hook that may have run in such a graph
UNSEEN_GRAPH = (
    "a backward graph that compiled autograd compiled before tracing began ran inside the trace "
    "(hooktrace reads a graph's hooks when it is compiled)"
)


class Runs:
    """The runs of compiled graphs during one capture (`record_run` is CURRENT.graph_runs while it
    is open)."""

    def __init__(self, rec: shims.Recorder) -> None:
        self.runs: list[Run] = []
        self._rec = rec

    def record_run(
        self, number: int, backward: bool, hooks: Compiled, fn: Any, args: Any, kwargs: Any
    ) -> Any:
        rec = self._rec
        entries = tuple((hid, _key(rec, ref)) for hid, ref in hooks)
        enter, tid, t0 = next(rec.seq), threading.get_ident(), time.perf_counter_ns()
        error = None
        try:
            return fn(*args, **kwargs)
        except BaseException as e:
            error = shims.error_text(e)
            raise
        finally:
            t1 = time.perf_counter_ns()
            self.runs.append((enter, next(rec.seq), tid, t0, t1, number, backward, entries, error))


def _key(rec: shims.Recorder, ref: Any) -> Optional[int]:
    if ref is ONLY_AS_PYTHON:
        return ONLY_AS_PYTHON
    module = ref() if ref is not None else None
    return None if module is None else rec.module_key(module)


def _graph_runner(fn: Any, number: int, hooks: Compiled, names: list[str]) -> Callable[..., Any]:
    """What Dynamo installs for a compiled forward graph holding hooks: `fn`, each run recorded into
    the capture open then (none: `fn` alone); while a profiler records, inside a `record_function`
    range naming the graph's hooks (`names`) in program order."""
    import torch

    profiler = torch.autograd.profiler
    label = graph_label(number, False, names)

    def hooktrace_graph_run(*args: Any, **kwargs: Any) -> Any:
        runs = CURRENT.graph_runs
        if runs is None:
            return fn(*args, **kwargs)
        if profiler._is_profiler_enabled:
            with profiler.record_function(label):
                return runs(number, False, hooks, fn, args, kwargs)
        return runs(number, False, hooks, fn, args, kwargs)

    if getattr(fn, "_boxed_call", False):  # called with one list of arguments: passed on as it is
        hooktrace_graph_run._boxed_call = True  # type: ignore[attr-defined]
    return hooktrace_graph_run


def _recompiled(fn: Any) -> Any:
    """What Dynamo does itself to a lazy graph module the backend returns (compiles its code now),
    which it cannot see once `fn` is wrapped: the same, before wrapping."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    lazy = fn if isinstance(fn, _LazyGraphModule) else getattr(fn, "__self__", None)
    if not isinstance(lazy, _LazyGraphModule) or (lazy is not fn and fn.__name__ != "_lazy_forward"):
        return fn
    _LazyGraphModule.force_recompile(lazy)
    return fn if lazy is fn else lazy.forward


_END_CAPTURE_PARAMS = ["self", "outputs"]
# torch 2.8 (run): Dynamo compiles PyTorch's multi-grad inner hook into the compiled-autograd graph, so
# the user's function runs inside the graph (its effects replayed), never as Python; 2.13 breaks the
# graph there and runs it as Python. 2.9 to 2.12 were not run with compiled autograd: taken as 2.8.
_MULTI_GRAD_IN_GRAPH = (release(str(torch.__version__)) or (2, 13)) < (2, 13)
_RUNTIME_PARAMS = ["compiled_fn", "inputs", "sizes", "scalars", "hooks", "packed_inputs"]


def _cell(fn: Any, name: str) -> Any:
    code = getattr(fn, "__code__", None)
    closure = getattr(fn, "__closure__", None)
    if code is None or closure is None or name not in code.co_freevars:
        return None
    try:
        return closure[code.co_freevars.index(name)].cell_contents
    except ValueError:  # an empty cell
        return None


def _shims(obj: Any) -> list[Any]:
    """The shims a callable of the `hooks` list stands for (a shim: itself; PyTorch's BackwardHook
    closures: the shims of its module's full backward (pre-)hooks); [] for others."""
    if getattr(obj, "__code__", None) in shims.SHIM_CODES:
        return [obj]
    owner = _cell(obj, "self")
    qualname = getattr(obj, "__qualname__", "")
    if owner is None or not qualname.startswith("BackwardHook."):
        return []
    held = owner.user_hooks if qualname.startswith("BackwardHook._set_user_hook") else owner.user_pre_hooks
    return [shim for fn in held or () for shim in _shims(fn)]


def hook_ids(obj: Any) -> list[int]:
    """The traced hook ids a callable of the `hooks` list stands for (its shims')."""
    return [hid for shim in _shims(obj) if isinstance(hid := _cell(shim, "hook_id"), int)]


def _names(hooks: Any, slots: list[int]) -> list[str]:
    """The names of the hooks at `slots` of a run's `hooks` list, in graph order (a profiler's range)."""
    out = []
    for slot in slots:
        obj = hooks[slot] if slot < len(hooks) else None
        cell = hookapis.inner_cell(obj)
        if cell is not None:  # PyTorch's multi-grad inner hook: the user's function it calls
            try:
                obj = cell.cell_contents
            except ValueError:
                continue
        out += [sites.hook_name(_cell(shim, "fn")) for shim in _shims(obj)]
    return out


def _entries(hooks: Any, slots: list[int]) -> tuple[tuple[int, Optional[int]], ...]:
    """The run's entries for the callables at `slots` of its `hooks` list: (hook id, None) for a hook
    of the graph; (hook id, ONLY_AS_PYTHON) for PyTorch's multi-grad inner hook, which Dynamo never
    traces (a graph break: it runs as Python) and which calls the user's function (its shim) only
    when its condition is met: in mode "all" the last of its inner hooks to run (the graph's last
    slot of it), in mode "any" the first; the place of that call, if it made one."""
    out: list[Optional[tuple[int, Optional[int]]]] = []
    placed: dict[int, int] = {}  # hook id of a multi-grad hook -> index of its entry in out
    for slot in slots:
        if slot >= len(hooks):
            continue
        obj = hooks[slot]
        cell = hookapis.inner_cell(obj)
        if cell is None:
            out += [(i, None) for i in hook_ids(obj)]
            continue
        try:
            ids = hook_ids(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
        last = getattr(obj, "__name__", "") == "inner_hook"  # mode "all" (mode "any": wrapped_fn)
        for i in ids:
            if i in placed and not last:
                continue
            if i in placed:
                out[placed[i]] = None
            placed[i] = len(out)
            out.append((i, None if _MULTI_GRAD_IN_GRAPH else ONLY_AS_PYTHON))
    return tuple(e for e in out if e is not None)


def _hook_slots(graph: Any, call_hook: Any) -> list[int]:
    """Indices into the `hooks` input of the graph's `call_hook` nodes, in graph order."""
    slots = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target is not call_hook or not node.args:
            continue
        source = node.args[0]
        if getattr(source, "op", None) == "call_function" and len(source.args) == 2:
            index = source.args[1]
            if isinstance(index, int):
                slots.append(index)
    return slots


class Installed:
    """The end_capture patch of one capture, recorded in `ledger`; `runs` what it saw, `note` why it
    is not installed."""

    def __init__(self, rec: shims.Recorder, ledger: Ledger) -> None:
        self.note: Optional[str] = None
        self.unseen = 0  # backward passes that ran a compiled-autograd graph compiled before (not seen)
        self.watches_backward = False  # around_backward is claimed: the engine must call it
        if "torch._dynamo" not in sys.modules:
            return  # never imports Dynamo: compiled autograd needs it imported before backward runs
        try:
            from torch._dynamo import compiled_autograd, external_utils
        except ImportError:
            return
        cls = getattr(compiled_autograd, "AutogradCompilerInstance", None)
        original = getattr(cls, "end_capture", None)
        call_hook = getattr(external_utils, "call_hook", None)
        if (
            cls is None
            or original is None
            or call_hook is None
            or not dynamo.signature_is(original, _END_CAPTURE_PARAMS)
        ):
            self.note = (
                "compiled autograd: this torch's AutogradCompilerInstance.end_capture is not the one "
                "hooktrace reads; hooks inside a compiled-autograd backward graph are not traced"
            )
            return

        def end_capture(instance: Any, outputs: Any) -> Any:
            runtime_wrapper, compiled = original(instance, outputs)
            known = dynamo.signature_is(runtime_wrapper, _RUNTIME_PARAMS)
            slots = _hook_slots(instance.fx_tracer.graph, call_hook) if known else []
            if not slots:  # no hook in it (or a runtime this does not read): its runs are only counted

                def hooktrace_compiled_backward_counted(*args: Any, **kwargs: Any) -> Any:
                    _SEEN_BACKWARD_CALLS[0] += 1
                    return runtime_wrapper(*args, **kwargs)

                return hooktrace_compiled_backward_counted, compiled
            number, profiler = next(_NUMBERS), torch.autograd.profiler

            def hooktrace_compiled_backward(
                compiled_fn: Any, inputs: Any, sizes: Any, scalars: Any, hooks: Any, packed_inputs: Any
            ) -> Any:
                _SEEN_BACKWARD_CALLS[0] += 1
                runs = CURRENT.graph_runs
                if runs is None:
                    return runtime_wrapper(compiled_fn, inputs, sizes, scalars, hooks, packed_inputs)
                ids = _entries(hooks, slots)
                args = (compiled_fn, inputs, sizes, scalars, hooks, packed_inputs)
                if profiler._is_profiler_enabled:
                    with profiler.record_function(graph_label(number, True, _names(hooks, slots))):
                        return runs(number, True, ids, runtime_wrapper, args, {})
                return runs(number, True, ids, runtime_wrapper, args, {})

            return hooktrace_compiled_backward, compiled

        end_capture.__wrapped__ = original  # type: ignore[attr-defined]
        ledger.set(cls, "end_capture", end_capture)
        ledger.claim("around_backward", self.around_backward, "backward watch")
        self.watches_backward = True

    def around_backward(self, run: Callable[..., Any], engine: Any, args: Any, kwargs: Any) -> Any:
        """One backward pass (the engine's `run_backward`): under compiled autograd, when it calls
        no graph whose compile hooktrace saw, it ran one compiled before (cached by PyTorch, hooks
        inside): counted in `unseen`, which `never-fired` names."""
        ca = sys.modules.get("torch._dynamo.compiled_autograd")
        if (
            ca is None
            or not getattr(ca, "compiled_autograd_enabled", False)
            or getattr(ca, "compiled_autograd_enabled_force_eager", False)
            or _is_compiling()
        ):
            return run(engine, *args, **kwargs)
        before = _SEEN_BACKWARD_CALLS[0]
        result = run(engine, *args, **kwargs)
        if _SEEN_BACKWARD_CALLS[0] == before:
            self.unseen += 1
        return result


# Compiled forward: the hooks Dynamo inlines into a graph, in program order.
#
# While Dynamo traces a frame, each Python function it inlines goes through the classmethod
# `InliningInstructionTranslator.inline_call(parent, func, args, kwargs, ...)`. PyTorch's own
# `_call_impl` (what Dynamo inlines for a module call: the views hand it the hook dicts themselves
# while it compiles) calls each forward (pre-)hook, so a hook Dynamo compiles into the graph is one
# inline_call whose function is the hook (or, for a `functools.partial` or a callable object, the
# function it calls) and whose first argument is the module. An inline that raises (a graph break
# inside the hook) takes its entry out again, and those of what it inlined. The hooks
# inlined into one OutputGraph are kept on it and taken when `OutputGraph.call_user_compiler` hands
# its FX graph to the backend (the compiled function is not touched: the same graph, the same code).

# (seq when the graph was compiled, trace ids of the hooks Dynamo compiled into it, in order)
Graph = tuple[int, tuple[int, ...]]
# inlined hooks are kept as (trace id, hook object, weak reference to the module or None): the hook
# object is held while its id is, so the id names no other object meanwhile
_INLINED = "_hooktrace_inlined_hooks"
# torch 2.8: (parent, func, args, kwargs); 2.13, 2.14 and 2.15 add allow_nested_graph_breaks (passed through)
_INLINE_PARAMS = ["parent", "func", "args", "kwargs", "allow_nested_graph_breaks"]
_INLINE_PARAMS_OLD = _INLINE_PARAMS[:4]
_COMPILER_PARAMS = ["self", "gm", "example_inputs"]
# the module dicts whose hooks `_call_impl` calls in forward, by kind
_FORWARD_DICTS = kinds.dicts_of(kinds.MODULE, (kinds.K.forward_pre, kinds.K.forward))
_GLOBAL_DICTS = kinds.dicts_of(kinds.GLOBAL, (kinds.K.forward_pre, kinds.K.forward))


def _calls(hook: Any, fn: Any) -> bool:
    """`hook` is `fn`, or a partial / callable object whose call Dynamo inlines as `fn`."""
    if hook is fn:
        return True
    inner = getattr(hook, "func", None)  # functools.partial (nested partials are flattened)
    if inner is not None and (inner is fn or getattr(inner, "__func__", None) is fn):
        return True
    if isinstance(hook, type):
        return False
    try:
        return type(hook).__call__ is fn  # a callable object: Dynamo inlines its class's __call__
    except AttributeError:
        return False


class Forward:
    """The inline_call / call_user_compiler patches of one capture, recorded in its ledger; `graphs`
    what they saw."""

    def __init__(self, rec: shims.Recorder, trace_id: Callable[[dict, int], int], ledger: Ledger) -> None:
        self.graphs: list[Graph] = []  # every graph compiled in the block, with no hook too
        # trace id -> whether each inline of the hook added an FX node or a side effect (Dynamo's
        # replayed Python effects): a hook whose inlines added none does nothing at run time
        self.effects: dict[int, list[bool]] = {}
        self.note: Optional[str] = None
        self._rec = rec
        self._trace_id = trace_id
        self._ledger = ledger
        self.installed = False

    def install(self) -> None:
        """Patch Dynamo if it is imported and has what this reads; once per capture."""
        if self.installed or "torch._dynamo" not in sys.modules:
            return
        self.installed = True
        try:
            from torch._dynamo import output_graph, symbolic_convert
        except ImportError:
            return
        translator = getattr(symbolic_convert, "InliningInstructionTranslator", None)
        graph_cls = getattr(output_graph, "OutputGraph", None)
        inline = getattr(translator, "inline_call", None)
        compiler = getattr(graph_cls, "call_user_compiler", None)
        if (
            translator is None
            or graph_cls is None
            or not isinstance(vars(translator).get("inline_call"), classmethod)
            or not (
                dynamo.signature_is(inline, _INLINE_PARAMS) or dynamo.signature_is(inline, _INLINE_PARAMS_OLD)
            )
            or not dynamo.signature_is(compiler, _COMPILER_PARAMS)
        ):
            self.note = (
                "torch.compile: this torch's Dynamo has no InliningInstructionTranslator.inline_call / "
                "OutputGraph.call_user_compiler as hooktrace reads them; the hooks Dynamo compiles into "
                "a graph are not listed"
            )
            warnings.warn(self.note, RuntimeWarning, stacklevel=2)
            return
        original_inline = vars(translator)["inline_call"]
        inline_fn = original_inline.__func__
        original_compiler = vars(graph_cls)["call_user_compiler"]
        graphs = self.graphs
        counter = self._rec.seq
        find = self._hook_ids
        effects = self.effects

        def inline_call(
            cls: Any, parent: Any, func: Any, args: Any, kwargs: Any, *rest: Any, **more: Any
        ) -> Any:
            try:
                fn = vars(func).get("fn")
                found = find(parent, fn, args) if fn is not None and args else None
            except Exception:  # noqa: BLE001 - reading Dynamo's trackers must never fail its compile
                found = None
            if not found:
                return inline_fn(cls, parent, func, args, kwargs, *rest, **more)
            # in program order (a hook that calls a module is listed before that module's hooks);
            # taken out again, with whatever was inlined inside it, if the inline raises
            output = parent.output
            inlined = getattr(output, _INLINED, None)
            if inlined is None:
                inlined = []
                setattr(output, _INLINED, inlined)
            start = len(inlined)
            inlined.extend(found)
            before = dynamo.footprint(output)
            try:
                result = inline_fn(cls, parent, func, args, kwargs, *rest, **more)
            except BaseException:
                del inlined[start:]
                raise
            after = dynamo.footprint(output)
            if before is not None and after is not None:
                first = found[0]
                effects.setdefault(first[0] if isinstance(first, tuple) else first, []).append(
                    before != after
                )
            return result

        def call_user_compiler(output: Any, gm: Any, example_inputs: Any) -> Any:
            compiled = original_compiler(output, gm, example_inputs)
            inlined = getattr(output, _INLINED, None)
            if not inlined:  # a graph with no hook: still a graph compiled (--compare-eager reads them)
                graphs.append((next(counter), ()))
                return compiled
            graphs.append((next(counter), tuple(hid for hid, _hook, _ref in inlined)))
            hooks = tuple((hid, ref) for hid, _hook, ref in inlined)
            names = [sites.hook_name(hook) for _hid, hook, _ref in inlined]
            inlined.clear()
            return _graph_runner(_recompiled(compiled), next(_NUMBERS), hooks, names)

        call_user_compiler.__wrapped__ = original_compiler  # type: ignore[attr-defined]
        self._ledger.set(translator, "inline_call", classmethod(inline_call))
        self._ledger.set(graph_cls, "call_user_compiler", call_user_compiler)
        dynamo.same_short_cut(self._ledger)

    def _hook_ids(self, parent: Any, fn: Any, args: Any) -> list[tuple[int, Any, Any]]:
        """(trace id, hook, weak reference to the module) of the forward hook `fn` is, global or of
        the module among `args` (the first argument; after a partial's own arguments or a callable
        object's `self`)."""
        import torch.nn.modules.module as nn_module

        module = next((m for m in (dynamo.module_of(parent, a) for a in args[:4]) if m is not None), None)
        found: list[tuple[int, Any, Any]] = []
        ref = None if module is None else weakref.ref(module)
        dicts_of: list[tuple[Any, str]] = [
            (getattr(nn_module, name, None), kind) for name, kind in _GLOBAL_DICTS
        ]
        if module is not None:
            dicts_of += [(getattr(module, name, None), kind) for name, kind in _FORWARD_DICTS]
        for d, _kind in dicts_of:
            if not isinstance(d, dict):
                continue
            for hid, hook in list(d.items()):
                if _calls(hook, fn):
                    found.append((self._trace_id(d, hid), hook, ref))
                    return found  # one inline is one call of one hook
        return found
