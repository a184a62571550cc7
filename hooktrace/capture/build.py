"""Records -> Trace: what a finished capture leaves, and the trace built from it at first use."""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass
from itertools import chain, islice
from operator import itemgetter
from typing import Any, Optional

from .. import kinds
from ..kinds import ENTER, EXIT, HOOK, NODE, TENSOR
from ..schema import Event, Hook, Meta, Module, Trace

# The phase of a hook event by kind (kinds.TABLE); None: the phase of the module call it ran in.
_PHASE_OF_KIND = {name: k.phase for name, k in kinds.TABLE.items()}
# Kinds with no module of their own: their events name the module call they ran in.
_MODULE_OF_CALL = frozenset(k for k in kinds.SAVED_TENSORS_KINDS if kinds.TABLE[k].phase is kinds.ENCLOSING)
_HOOK_FIELDS = tuple(f.name for f in dataclasses.fields(Hook))


@dataclass
class Record(Hook):
    """A hook while capturing: the trace's Hook plus the live objects it came from."""

    owner: Any = None  # the owner's Who (shims.Recorder.who: key, type name), or None
    tensor_ref: Any = None  # weakref to the tensor (tensor scope)
    tensor_desc: Optional[tuple[str, Any]] = None  # ("output of"|"input of"|"tensor in", Who) or None
    removed: bool = False
    # (dtype, device) of the parameter an AccumulateGrad node accumulates, when a hook went on the node
    node_of: Optional[tuple[Any, Any]] = None
    # (module path, name, (dtype, device)) of the model's parameter the hook went on, as it was then
    param_of: Optional[tuple[str, str, Any]] = None


@dataclass
class Pending:
    """What a finished capture leaves for building its trace: ints, strings and records only."""

    meta: Meta
    start_ns: int
    modules: list[Module]
    records: list[Record]  # in the trace's hook order, module/tensor filled in, live refs dropped
    paths: dict[int, str]  # id of a module at capture time -> its path
    hook_calls: list[tuple]  # Recorder.hooks; a shim kept and called after the block would still
    n_hook_calls: int  # append to it: only the first n_hook_calls belong to the trace
    module_calls: list[tuple]  # Recorder.calls
    n_module_calls: int
    step_starts: list[int]
    compiled: list[int] = dataclasses.field(default_factory=list)  # Recorder.compiled
    deleted: set[int] = dataclasses.field(default_factory=set)  # hooks code took out of their dict
    # node hooks on an AccumulateGrad node that their parameter's move (.to(), .double()) replaced
    replaced_nodes: set[int] = dataclasses.field(default_factory=set)
    # hooks on a parameter the model no longer holds: a move made a new tensor (trace id -> its name)
    replaced_params: dict[int, str] = dataclasses.field(default_factory=dict)
    in_backward: list[int] = dataclasses.field(default_factory=list)  # Recorder.in_backward
    shapes: Optional[list[tuple]] = None  # Recorder.shapes: (seq, received, returned) with --shapes
    # compiled.Runs.runs: each run of a compiled graph (Dynamo's forward graphs, compiled autograd's)
    graph_runs: list[tuple] = dataclasses.field(default_factory=list)
    # compiled.Forward.graphs: (seq at compile, hook ids Dynamo compiled into the graph, in order)
    # None: not known (Dynamo was not patched)
    compiled_graphs: Optional[list[tuple[int, tuple[int, ...]]]] = dataclasses.field(default_factory=list)


def build_trace(pending: Pending) -> Trace:
    """The trace of what the capture saw, with no surprises: whoever runs the capture adds the
    analysis' (given `compiled_windows`, `pending.deleted` and `pending.replaced_nodes`, the facts only
    the capture knows)."""
    hooks = [to_hook(r) for r in pending.records]
    events = build_events(pending, {h.id: h for h in hooks})
    return Trace(meta=pending.meta, modules=pending.modules, hooks=hooks, events=events)


Windows = dict[Optional[str], list[tuple[int, int]]]
# the module key of a graph run's entry that stands for a hook only when it ran as Python (PyTorch's
# multi-grad inner hook in a compiled-autograd graph calls the user's function, or does not)
ONLY_AS_PYTHON = -1


def compiled_windows(pending: Pending) -> Windows:
    """The module calls that ran compiled by torch.compile, by module path (None: a module outside
    the model): (seq of the call's `enter` event, seq of its `exit` event; -1 when not in the trace).
    A fact of the capture; `analysis.compiled` says which hooks it hid."""
    compiled = set(pending.compiled)
    calls: dict[Optional[str], list[tuple[int, int]]] = {}
    for enter, leave, _phase, module_id, *_ in islice(pending.module_calls, pending.n_module_calls):
        if enter in compiled:
            calls.setdefault(pending.paths.get(module_id), []).append((enter, leave))
    if not calls:
        return {}
    to_event = _raw_to_event_seqs(pending)
    return {
        path: [(to_event.get(enter, -1), to_event.get(leave, -1)) for enter, leave in spans]
        for path, spans in calls.items()
    }


def graph_rows(pending: Pending, hooks: dict[int, Hook]) -> list[tuple]:
    """The `graph` events and the hook events of the hooks that ran inside each graph, as raw rows
    of `build_events` (their sort keys place a graph's hooks after its run began, in the graph's
    order, around the hooks of that run that ran as Python, which their shims traced as usual).

    Each hook inside a graph is a hook event with the run's thread and start, no duration, and the
    graph's number; its module: the module it was called for (a global hook's), else the hook's own.
    """
    rows: list[tuple] = []
    if not pending.graph_runs:
        return rows
    start, paths = pending.start_ns, pending.paths
    # (seq, hook id, module key) of each Python hook call
    calls = sorted((r[0], r[1], r[6]) for r in islice(pending.hook_calls, pending.n_hook_calls))
    for enter, leave, tid, t0, t1, number, backward, entries, error in pending.graph_runs:
        phase = kinds.BACKWARD if backward else None
        rows.append(
            (
                enter,
                kinds.GRAPH,
                phase,
                None,
                None,
                None,
                tid,
                t0 - start,
                t1 - t0,
                False,
                error,
                None,
                number,
            )
        )
        first, last = bisect.bisect(calls, (enter,)), bisect.bisect(calls, (leave,))
        # (hook id, module key) -> seqs of its Python calls inside the run, first first. A hook of
        # the graph that ran as Python is the same hook called for the same module: a global hook
        # that AOTAutograd's compiled forward (a GraphModule, called as a module) fires is no entry's
        python: dict[tuple[int, Optional[int]], list[int]] = {}
        for seq, hid, module_id in calls[first:last]:
            python.setdefault((hid, None), []).append(seq)  # an entry of no module: any call of it
            if module_id is not None:
                python.setdefault((hid, module_id), []).append(seq)
        at, n = enter, len(entries) + 1
        for i, (hid, module_key) in enumerate(entries):
            optional = module_key == ONLY_AS_PYTHON
            ran = python.get((hid, None if optional else module_key))
            if optional and not ran:
                continue  # it made no call
            if ran:
                seq = ran.pop(0)  # traced by its shim: the next hooks of the graph come after it
                at = seq
                for other in python.values():  # that call is no other entry's
                    if seq in other:
                        other.remove(seq)
                continue
            hook = hooks.get(hid)
            if hook is None:
                continue
            path = paths.get(module_key) if module_key is not None else None
            if path is None and hook.scope != kinds.GLOBAL:
                path = hook.module
            kind = hook.kind
            key = at + (i + 1) / (n + 1)
            rows.append(
                (
                    key,
                    HOOK,
                    _PHASE_OF_KIND.get(kind, kinds.OTHER),
                    path,
                    hid,
                    kind,
                    tid,
                    t0 - start,
                    0,
                    False,
                    None,
                    None,
                    number,
                )
            )
    return rows


def compiled_graphs(pending: Pending) -> Optional[dict[Optional[str], list[tuple[int, ...]]]]:
    """The hooks Dynamo compiled into each graph during the capture, in program order, by the path
    of the compiled module call it was compiled in (None: in no such call, or outside the model);
    None when not known (Dynamo not patched)."""
    if pending.compiled_graphs is None:
        return None
    if not pending.compiled_graphs:
        return {}
    compiled = set(pending.compiled)
    spans = [
        (enter, leave, pending.paths.get(module_id))
        for enter, leave, _phase, module_id, *_ in islice(pending.module_calls, pending.n_module_calls)
        if enter in compiled
    ]
    out: dict[Optional[str], list[tuple[int, ...]]] = {}
    for seq, ids in pending.compiled_graphs:
        inside = [(enter, path) for enter, leave, path in spans if enter < seq < leave]
        path = max(inside)[1] if inside else None  # the innermost compiled call
        out.setdefault(path, []).append(ids)
    return out


def _raw_to_event_seqs(pending: Pending) -> dict[int, int]:
    """Capture seqs of module-call enters -> the seq of their `enter` event in the trace."""
    hooks = {r.id: r for r in pending.records}
    raw = sorted(
        [r[0] for r in islice(pending.hook_calls, pending.n_hook_calls)]
        + [s for r in islice(pending.module_calls, pending.n_module_calls) for s in r[:2]]
        + [r[0] for r in graph_rows(pending, hooks)]  # type: ignore[arg-type]
    )
    return {seq: i for i, seq in enumerate(raw)}


def build_events(pending: Pending, hooks: dict[int, Hook]) -> list[Event]:
    """Compact records -> the format's events, in `seq` order, renumbered 0.. without gaps.

    A forward-kind hook takes the phase of the innermost module call open on its thread (it runs
    inside that call's `_call_impl`): `recompute` when that call started during backward.
    """
    start = pending.start_ns
    paths = pending.paths
    info = {
        hid: (
            h.kind,
            _PHASE_OF_KIND.get(h.kind, kinds.OTHER),
            h.module if h.scope in (TENSOR, NODE) else None,
        )
        for hid, h in hooks.items()
    }
    raw: list[tuple] = []
    append = raw.append
    described = {seq: shapes_text(got, gave) for seq, got, gave in pending.shapes or ()}
    shapes_of = described.get if described else _none
    for seq, hid, tid, t0, t1, outcome, module_id in islice(pending.hook_calls, pending.n_hook_calls):
        known = info.get(hid)
        if (
            known is None
        ):  # a shim kept past its own capture (capture/kept.py), of a hook not seen in this one
            continue
        kind, phase, tensor_module = known
        path = paths.get(module_id) if module_id is not None else tensor_module
        error = outcome if outcome.__class__ is str else None
        append(
            (
                seq,
                HOOK,
                phase,
                path,
                hid,
                kind,
                tid,
                t0 - start,
                t1 - t0,
                outcome is True,
                error,
                shapes_of(seq),
                None,
            )
        )
    for enter, leave, phase, module_id, tid, t0, t1, error in islice(
        pending.module_calls, pending.n_module_calls
    ):
        path = paths.get(module_id)
        append((enter, ENTER, phase, path, None, None, tid, t0 - start, t1 - t0, False, None, None, None))
        append((leave, EXIT, phase, path, None, None, tid, t1 - start, 0, False, error, None, None))
    raw += graph_rows(pending, hooks)
    raw.sort(key=itemgetter(0))

    backward = frozenset(pending.in_backward)
    starts = [*pending.step_starts, float("inf")]  # the seq at which step 1, 2, ... began
    step = 0
    # thread -> (phase, path) of open calls. The capture records each call whole (enter, leave) on
    # its thread's stack of Python frames, so a leave is always its thread's innermost open call:
    # no pairing by module here (that is analysis.calls', for events read from any trace).
    open_calls: dict[int, list[tuple[str, Optional[str]]]] = {}
    new = tuple.__new__  # Event's fields in order, without NamedTuple's Python-level __new__
    events: list[Event] = []
    add = events.append
    for i, (
        seq,
        type_,
        phase,
        path,
        hid,
        kind,
        tid,
        t,
        duration,
        returned,
        error,
        shapes,
        graph,
    ) in enumerate(raw):
        while seq >= starts[step]:
            step += 1
        if type_ == HOOK:
            if phase is None:
                stack = open_calls.get(tid)
                phase = stack[-1][0] if stack else kinds.BACKWARD if seq in backward else kinds.FORWARD
                if path is None and kind in _MODULE_OF_CALL and stack:
                    path = stack[-1][1]
        elif type_ == ENTER:
            open_calls.setdefault(tid, []).append((phase, path))
        elif type_ == EXIT:
            stack = open_calls.get(tid)
            if stack:
                stack.pop()
        elif phase is None:  # a forward graph: in the module call open on its thread
            stack = open_calls.get(tid)
            phase, path = stack[-1] if stack else (kinds.FORWARD, None)
        add(
            new(
                Event,
                (i, step, type_, phase, path, hid, kind, tid, t, duration, returned, error, shapes, graph),
            )
        )
    return events


def _none(_seq: int) -> None:
    return None


def shapes_text(received: str, returned: Optional[str]) -> str:
    """The `shapes` text of one hook call: what it received, then ` -> ` what it returned, if anything."""
    return received if returned is None else f"{received} -> {returned}"


def ordered(records: dict[int, Record], order: list[int]) -> list[Record]:
    """Hooks in the order PyTorch will fire them (the final walk's order), then the rest by id."""
    out = []
    for hid in dict.fromkeys(order + sorted(records)):
        record = records.get(hid)
        if record is not None:
            out.append(record)
    return out


_hook_values = itemgetter(*_HOOK_FIELDS)


def to_hook(r: Record) -> Hook:
    """The record's Hook fields as they are (a Record is a Hook), without the dataclass __init__."""
    hook = object.__new__(Hook)
    hook.__dict__.update(zip(_HOOK_FIELDS, _hook_values(r.__dict__)))
    return hook


def device_of(model: Any) -> str:
    """`meta.device`: where the model's tensors are. "meta" (a dry run) only when every parameter
    and buffer is on meta and no offload hook (accelerate's `_hf_hook`) brings the weights in."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return "cpu"
    tensors = chain(model.parameters(), model.buffers())
    first = next(tensors, None)
    if first is None:
        return "cpu"
    if not first.is_meta:
        return str(first.device)
    real = next((t for t in tensors if not t.is_meta), None)
    if real is not None:  # offloaded: some weights are elsewhere
        return str(real.device)
    for module in model.modules():
        declared = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
        if declared is not None:
            return str(torch.device(declared if not isinstance(declared, int) else f"cuda:{declared}"))
    return str(first.device)
