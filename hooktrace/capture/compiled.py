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

Each run is kept as (enter seq, exit seq, hook ids in graph order); hooks of a run that still ran
as Python (a graph break, e.g. PyTorch's multi-grad inner hook, which Dynamo never traces) are
traced by their shims as usual and dropped from the run's list by the analysis.

Lazy and guarded: the patch is installed only when `torch._dynamo` is already imported when the
capture starts (an eager user never imports Dynamo because of hooktrace), and only on a torch whose
`end_capture` has the signature this reads; otherwise one note says the compiled-autograd hooks are
not traced, and the rest is.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Optional

from . import shims
from .ledger import Ledger

# (enter seq, exit seq, hook ids in the graph's order) per run of a compiled-autograd graph
Run = tuple[int, int, tuple[int, ...]]

_END_CAPTURE_PARAMS = ["self", "outputs"]
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


def hook_ids(obj: Any) -> list[int]:
    """The traced hook ids a callable of the `hooks` list stands for (a shim: its own; PyTorch's
    BackwardHook closures: the shims of its module's full backward (pre-)hooks); [] for others."""
    code = getattr(obj, "__code__", None)
    if code in shims.SHIM_CODES:
        hid = _cell(obj, "hook_id")
        return [hid] if isinstance(hid, int) else []
    owner = _cell(obj, "self")
    qualname = getattr(obj, "__qualname__", "")
    if owner is None or not qualname.startswith("BackwardHook."):
        return []
    held = owner.user_hooks if qualname.startswith("BackwardHook._set_user_hook") else owner.user_pre_hooks
    return [i for fn in held or () for i in hook_ids(fn)]


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
        self.runs: list[Run] = []
        self.note: Optional[str] = None
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
            or not _signature_is(original, _END_CAPTURE_PARAMS)
        ):
            self.note = (
                "compiled autograd: this torch's AutogradCompilerInstance.end_capture is not the one "
                "hooktrace reads; hooks inside a compiled-autograd backward graph are not traced"
            )
            return
        runs = self.runs
        counter = rec.seq

        def end_capture(instance: Any, outputs: Any) -> Any:
            runtime_wrapper, compiled = original(instance, outputs)
            slots = _hook_slots(instance.fx_tracer.graph, call_hook)
            if not slots or not _signature_is(runtime_wrapper, _RUNTIME_PARAMS):
                return runtime_wrapper, compiled

            def hooktrace_compiled_backward(
                compiled_fn: Any, inputs: Any, sizes: Any, scalars: Any, hooks: Any, packed_inputs: Any
            ) -> Any:
                enter = next(counter)
                ids = tuple(i for slot in slots if slot < len(hooks) for i in hook_ids(hooks[slot]))
                try:
                    return runtime_wrapper(compiled_fn, inputs, sizes, scalars, hooks, packed_inputs)
                finally:
                    runs.append((enter, next(counter), ids))

            return hooktrace_compiled_backward, compiled

        end_capture.__wrapped__ = original  # type: ignore[attr-defined]
        ledger.set(cls, "end_capture", end_capture)


def _signature_is(fn: Any, names: list[str]) -> bool:
    try:
        return list(inspect.signature(fn).parameters) == names
    except (TypeError, ValueError):
        return False
