"""Records -> Trace: what a finished capture leaves, and the trace built from it at first use."""

from __future__ import annotations

import bisect
import dataclasses
from collections import deque
from dataclasses import dataclass
from functools import partial
from itertools import chain, compress, count, islice, repeat
from operator import attrgetter, eq, getitem, is_, is_not, itemgetter, sub
from typing import Any, Optional

from .. import kinds
from ..kinds import ENTER, EXIT, HOOK, NODE, TENSOR
from ..schema import Event, Hook, Meta, Module, Trace

# The phase of a hook event by kind (kinds.TABLE); None: the phase of the module call it ran in.
_PHASE_OF_KIND = {name: k.phase for name, k in kinds.TABLE.items()}
# Kinds with no module of their own: their events name the module call they ran in.
_MODULE_OF_CALL = frozenset(k for k in kinds.SAVED_TENSORS_KINDS if kinds.TABLE[k].phase is kinds.ENCLOSING)
_HOOK_FIELDS = tuple(f.name for f in dataclasses.fields(Hook))
# scopes whose hooks' events name the hook's own module (1), not the module call's (0)
_OWN_MODULE_SCOPES = {TENSOR: 1, NODE: 1}
# a Hook's fields, read in C over all hooks
_id, _kind, _scope = attrgetter("id"), attrgetter("kind"), attrgetter("scope")
_module = attrgetter("module")  # not a kind: the field
_first, _second = itemgetter(0), itemgetter(1)  # a raw row's seq; a hook call's hook id


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
    # a backward pass the capture saw run untraced (compiled.UNSEEN_GRAPH), for never-fired
    unseen_backward: Optional[str] = None
    # compiled.Forward.graphs: (seq at compile, hook ids Dynamo compiled into the graph, in order)
    # None: not known (Dynamo was not patched)
    compiled_graphs: Optional[list[tuple[int, tuple[int, ...]]]] = dataclasses.field(default_factory=list)


def build_trace(pending: Pending) -> Trace:
    """The trace of what the capture saw, with no surprises: whoever runs the capture adds the
    analysis' (given `compiled_windows`, `pending.deleted` and `pending.replaced_nodes`, the facts only
    the capture knows)."""
    hooks = to_hooks(pending.records)
    events = build_events(pending, dict(zip(map(_id, hooks), hooks)))
    return Trace(meta=pending.meta, modules=pending.modules, hooks=hooks, events=events)


Windows = dict[Optional[str], list[tuple[int, int]]]
# the module key of a graph run's entry that stands for a hook only when it ran as Python (PyTorch's
# multi-grad inner hook in a compiled-autograd graph calls the user's function, or does not)
ONLY_AS_PYTHON = -1


def compiled_windows(pending: Pending) -> Windows:
    """The module calls that ran compiled by torch.compile, by module path (None: a module outside
    the model): (seq of the call's `enter` event, seq of its `exit` event; -1 when not in the trace).
    A fact of the capture; `analysis.compiled` says which hooks it hid."""
    if not pending.compiled:
        return {}
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

    Rows and events are made column by column (`map`, `zip`: C-level, no Python code per event);
    Python runs per event only where a phase follows from the module calls open on the thread.
    """
    raw = _hook_rows(pending, hooks)
    raw += _call_rows(pending)
    raw += graph_rows(pending, hooks)
    if not raw:
        return []
    raw.sort(key=_first)
    seqs, types, phase_column, path_column, hids, kinds_, tids, *rest = zip(*raw)
    phases, paths = [*phase_column], [*path_column]
    if None in phases:
        _enclosing(types, phases, paths, kinds_, tids, seqs, frozenset(pending.in_backward))
    # the step of each event: how many step starts (the seq at which step 1, 2, ... began) precede it
    bounds = [0, *(bisect.bisect_left(seqs, s) for s in pending.step_starts), len(seqs)]
    steps = chain.from_iterable(map(repeat, count(), map(sub, bounds[1:], bounds)))
    # Event's fields in order, without NamedTuple's Python-level __new__
    rows = zip(count(), steps, types, phases, paths, hids, kinds_, tids, *rest)
    return [*map(tuple.__new__, repeat(Event), rows)]


def _hook_rows(pending: Pending, hooks: dict[int, Hook]) -> list[tuple]:
    """Raw rows (`seq` first, then Event's fields from `type`) of the hook calls the shims recorded."""
    info = dict(zip(hooks, zip(*_hook_columns(hooks.values())))) if hooks else {}
    calls = pending.hook_calls[: pending.n_hook_calls]
    if calls and None in map(info.get, map(_second, calls)):
        # a shim kept past its own capture (capture/kept.py), of a hook not seen in this one
        calls = [c for c in calls if c[1] in info]
    if not calls:
        return []
    seqs, hids, tids, t0s, t1s, outcomes, module_ids = zip(*calls)
    kinds_, phases, tensor_modules = zip(*map(info.__getitem__, hids))
    # a module hook's module is the one it ran for; a tensor or node hook's, its own (no module_id)
    module_paths = map(pending.paths.get, module_ids)
    paths = map(getitem, zip(module_paths, tensor_modules), map(is_, module_ids, repeat(None)))
    errors: Any = repeat(None)
    if str in set(map(type, outcomes)):  # the text of an error a hook raised
        errors = [o if o.__class__ is str else None for o in outcomes]
    shapes: Any = repeat(None)
    if pending.shapes:
        described = {seq: shapes_text(got, gave) for seq, got, gave in pending.shapes}
        shapes = map(described.get, seqs)
    start = repeat(pending.start_ns)
    returned = map(is_, outcomes, repeat(True))
    durations = map(sub, t1s, t0s)
    return [
        *zip(
            seqs,
            repeat(HOOK),
            phases,
            paths,
            hids,
            kinds_,
            tids,
            map(sub, t0s, start),
            durations,
            returned,
            errors,
            shapes,
            repeat(None),
        )
    ]


def _call_rows(pending: Pending) -> list[tuple]:
    """Raw rows of the module calls: each call's `enter`, then its `exit`, as recorded."""
    calls = pending.module_calls[: pending.n_module_calls]
    if not calls:
        return []
    enters, leaves, phases, module_ids, tids, t0s, t1s, errors = zip(*calls)
    paths = [*map(pending.paths.get, module_ids)]
    start, none, no = repeat(pending.start_ns), repeat(None), repeat(False)
    durations = map(sub, t1s, t0s)
    entered = zip(
        enters,
        repeat(ENTER),
        phases,
        paths,
        none,
        none,
        tids,
        map(sub, t0s, start),
        durations,
        no,
        none,
        none,
        none,
    )
    left = zip(
        leaves,
        repeat(EXIT),
        phases,
        paths,
        none,
        none,
        tids,
        map(sub, t1s, start),
        repeat(0),
        no,
        errors,
        none,
        none,
    )
    return [*chain.from_iterable(zip(entered, left))]


def _hook_columns(hooks: Any) -> tuple[list, Any, Any]:
    """(kinds, phases, tensor modules) of the hooks: a tensor or node hook's events name its module."""
    kinds_ = [*map(_kind, hooks)]
    phases = map(_PHASE_OF_KIND.get, kinds_, repeat(kinds.OTHER))
    owned = map(_OWN_MODULE_SCOPES.get, map(_scope, hooks), repeat(0))
    return kinds_, phases, map(getitem, zip(repeat(None), map(_module, hooks)), owned)


def _enclosing(
    types: tuple, phases: list, paths: list, kinds_: tuple, tids: tuple, seqs: tuple, backward: frozenset
) -> None:
    """Fill in the phase (and for a saved-tensor hook, the module) of hook and graph events that take
    the innermost module call open on their thread's; a hook in no module call, `backward` when its
    seq is one the capture saw run inside backward, else `forward`.

    The capture records each call whole (enter, leave) on its thread's stack of Python frames, so a
    leave is always its thread's innermost open call: no pairing by module here (that is
    analysis.calls', for events read from any trace).
    """
    threads = set(tids)
    for tid in threads:
        rows = range(len(types)) if len(threads) == 1 else [*compress(count(), map(eq, tids, repeat(tid)))]
        stack: list[int] = []  # rows of the calls open on this thread, innermost last
        for i in rows:
            type_ = types[i]
            if type_ == ENTER:
                stack.append(i)
            elif type_ == EXIT:
                if stack:
                    stack.pop()
            elif phases[i] is None:
                if type_ == HOOK:
                    if stack:
                        phases[i] = phases[stack[-1]]
                    else:
                        phases[i] = kinds.BACKWARD if seqs[i] in backward else kinds.FORWARD
                    if paths[i] is None and kinds_[i] in _MODULE_OF_CALL and stack:
                        paths[i] = paths[stack[-1]]
                else:  # a forward graph: in the module call open on its thread
                    phases[i], paths[i] = (
                        (phases[stack[-1]], paths[stack[-1]]) if stack else (kinds.FORWARD, None)
                    )


def shapes_text(received: str, returned: Optional[str]) -> str:
    """The `shapes` text of one hook call: what it received, then ` -> ` what it returned, if anything."""
    return received if returned is None else f"{received} -> {returned}"


def ordered(records: dict[int, Record], order: list[int]) -> list[Record]:
    """Hooks in the order PyTorch will fire them (the final walk's order), then the rest by id."""
    found: Any = filter(partial(is_not, None), map(records.get, dict.fromkeys(order + sorted(records))))
    return [*found]


_hook_values = itemgetter(*_HOOK_FIELDS)


def to_hooks(records: list[Record]) -> list[Hook]:
    """Each record's Hook fields as they are (a Record is a Hook), without the dataclass __init__:
    C-level calls only, no Python code per hook."""
    hooks = [*map(object.__new__, repeat(Hook, len(records)))]
    fields = map(zip, repeat(_HOOK_FIELDS), map(_hook_values, map(vars, records)))
    deque(map(dict.update, map(vars, hooks), fields), maxlen=0)  # run to the end
    return hooks


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
