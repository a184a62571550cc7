"""Eager vs compiled (`--compare-eager`): the same window run twice in one process, once under
`torch.compiler.set_stance("force_eager")` and once compiled, compared by `diff.py`'s alignment;
then rules that say WHY hooks ran otherwise, each only when the two traces and what the capture saw
Dynamo do prove it (README, "Eager vs compiled: --compare-eager", has the rules and the upstream
issues they come from).

A pure function of two `Side`s: each a trace and the facts the driver read while it ran (the
graphs Dynamo compiled and the hooks it inlined into them, the module calls that ran compiled,
graphs compiled per step, the recompile limit's warning). Hooks are matched across the two traces
by `identity.HookKey`, as `diff` matches them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from ..kinds import ENTER, EXIT, FORWARD, GLOBAL, HOOK, K
from ..schema import ROOT, Event, Trace
from .counts import plural
from .diff import TraceDiff, diff_traces
from .identity import HookKey, hook_keys

# module path -> the hook ids Dynamo inlined into each graph compiled in calls of it, in order
Graphs = Mapping[Optional[str], Sequence[Sequence[int]]]
GRAPH_MODULE = "(torch.compile) GraphModule"  # how the capture names AOTAutograd's compiled forward

# the rules, in the order the report gives them (README, "Eager vs compiled")
RULES = (
    "stale_graph",
    "compiled_before",
    "inlined_no_ops",
    "inlined",
    "wrapper_calls",
    "replayed_after_graph",
    "recompiles",
)
ISSUES = {
    "stale_graph": "pytorch/pytorch#117758, #117265",
    "inlined_no_ops": "pytorch/pytorch#173452",
    "wrapper_calls": "pytorch/pytorch#149502",
    "replayed_after_graph": "pytorch/pytorch#116221",
    "recompiles": "pytorch/pytorch#93724",
}


@dataclass
class Side:
    """One run of the window: its trace and what Dynamo did in it.

    `graphs`: the hook ids Dynamo inlined into each graph compiled in this run, by module path
    (None: not known, Dynamo was not patched); `effects`: per hook id, whether each of its inlines
    added a graph node or a side effect; `compiled_paths`: the module paths whose calls ran
    compiled; `graphs_per_step`: graphs compiled in each step; `limit`: Dynamo's recompile-limit
    warning, when it was hit in this run."""

    trace: Trace
    graphs: Optional[Graphs] = None
    effects: Mapping[int, Sequence[bool]] = field(default_factory=dict)
    compiled_paths: frozenset[Optional[str]] = frozenset()
    graphs_per_step: Sequence[int] = ()
    limit: Optional[str] = None


@dataclass(frozen=True)
class Reason:
    rule: str  # one of RULES
    text: str
    hooks: tuple[str, ...] = ()  # labels of the hooks concerned

    def __str__(self) -> str:
        issue = ISSUES.get(self.rule)
        return f"[{self.rule}] {self.text}" + (f" ({issue})" if issue else "")


@dataclass
class Comparison:
    """`diff`: the compiled run's order against the eager one's; `reasons`: what explains it."""

    diff: TraceDiff
    reasons: list[Reason]
    eager_calls: int
    compiled_calls: int

    def report(self) -> str:
        lines = [
            "eager (force_eager) vs compiled: "
            + ("same hook order" if self.diff.equal else "the compiled run's hook order differs"),
            f"  eager: {plural(self.eager_calls, 'hook call')} as Python; compiled: {self.compiled_calls}",
        ]
        if not self.diff.equal:
            lines += ["", "what differs (expected: eager, got: compiled):"]
            lines += ["  " + line for line in self.diff.summary().splitlines()[1:]]
        lines += ["", "why:" if self.reasons else "why: no rule explains it from what was traced"]
        lines += [f"  - {r}" for r in self.reasons]
        return "\n".join(lines)


def _keys(trace: Trace) -> dict[int, HookKey]:
    return hook_keys(trace)


def _calls(trace: Trace, keys: dict[int, HookKey]) -> Counter[HookKey]:
    """Python calls of each hook (a hook event inside a compiled graph, `graph` set, is not one)."""
    return Counter(
        keys[e.hook]
        for e in trace.events
        if e.type == HOOK and e.hook in keys and getattr(e, "graph", None) is None
    )


def _under(module: Optional[str], path: Optional[str]) -> bool:
    if path is None or module is None:
        return False
    return path == "" or module == path or module.startswith(path + ".")


def _place(path: Optional[str]) -> str:
    return ROOT if path == "" else f"`{path}`"


def compare(eager: Side, compiled: Side) -> Comparison:
    """The compiled run against the eager one: the order differences and the reasons proven."""
    ka, kb = _keys(eager.trace), _keys(compiled.trace)
    ca, cb = _calls(eager.trace, ka), _calls(compiled.trace, kb)
    reasons = _missing(eager, compiled, ka, kb, ca, cb)
    reasons += _wrappers(eager, ka, "eager") + _wrappers(compiled, kb, "compiled")
    reasons += _replayed(eager, compiled, ka, kb)
    reasons += _recompiles(compiled, kb)
    reasons.sort(key=lambda r: RULES.index(r.rule))
    return Comparison(diff_traces(eager.trace, compiled.trace), reasons, sum(ca.values()), sum(cb.values()))


def _inlined(side: Side, keys: dict[int, HookKey]) -> dict[HookKey, list[Optional[str]]]:
    """Hook -> the module paths of the graphs (compiled in this run) it was inlined into."""
    out: dict[HookKey, list[Optional[str]]] = {}
    for path, graphs in (side.graphs or {}).items():
        for ids in graphs:
            for i in ids:
                if i in keys:
                    out.setdefault(keys[i], []).append(path)
    return out


def _missing(
    eager: Side,
    compiled: Side,
    ka: dict[int, HookKey],
    kb: dict[int, HookKey],
    ca: Counter[HookKey],
    cb: Counter[HookKey],
) -> list[Reason]:
    """Hooks that ran as Python in the eager run and never in the compiled one: why, when proven."""
    held = {kb[h.id]: h for h in compiled.trace.hooks if h.id in kb}
    in_b, in_a = _inlined(compiled, kb), _inlined(eager, ka)
    no_ops: dict[HookKey, bool] = {}
    for hid, effects in compiled.effects.items():
        if hid in kb and effects:
            no_ops[kb[hid]] = not any(effects)
    out = []
    for key in [k for k in ca if cb[k] == 0]:
        label, n = key.label(), plural(ca[key], "call")
        if key in no_ops and no_ops[key]:
            out.append(
                Reason(
                    "inlined_no_ops",
                    f"{label} ran as Python in the eager run ({n}) and never in the compiled one: Dynamo "
                    "inlined it into the graph and it added no op and no side effect there (its Python ran "
                    "once, while Dynamo traced it, e.g. a return under torch.compiler.is_compiling()), "
                    "so at run time it does nothing",
                    (label,),
                )
            )
            continue
        if key in in_b:
            where = ", ".join(
                sorted({_place(p) if p is not None else "a module outside the model" for p in in_b[key]})
            )
            out.append(
                Reason(
                    "inlined",
                    f"{label} ran as Python in the eager run ({n}); in the compiled run Dynamo inlined it "
                    f"into the graph of {where}: its ops and side effects run inside the graph, in program "
                    "order, with no Python call of its own",
                    (label,),
                )
            )
            continue
        hook = held.get(key)
        if hook is None or hook.registered_during_run or compiled.graphs is None:
            continue
        paths = [p for p in compiled.compiled_paths if key.scope == GLOBAL or _under(key.module, p)]
        seen = [
            (p, ids)
            for side, keys in ((eager, ka), (compiled, kb))
            for p, graphs in (side.graphs or {}).items()
            if p in paths
            for ids in graphs
        ]
        if paths and not seen and key not in in_a:
            where = ", ".join(sorted(_place(p) for p in paths))
            out.append(
                Reason(
                    "compiled_before",
                    f"{label} ran as Python in the eager run ({n}) and never in the compiled one: {where} ran "
                    "compiled with graphs Dynamo compiled before this run's capture opened (an untraced step "
                    "before the window, e.g. exec --start 1), and no graph was compiled in either run: "
                    "whether the hook runs inside such a graph (inlined) or not at all (a stale graph) is not "
                    "seen from here; compare from the first compiled call (exec --start 0)",
                    (label,),
                )
            )
            continue
        if not paths or not seen or key in in_a or eager.graphs is None:
            continue
        where = ", ".join(sorted(_place(p) for p in {p for p, _ in seen}))
        out.append(
            Reason(
                "stale_graph",
                f"{label} ran as Python in the eager run ({n}) and never in the compiled one, though it was "
                f"registered all along: {where} ran compiled with a graph Dynamo compiled before the hook was "
                "there (in the factory or an earlier step; no graph seen compiled holds it), and Dynamo puts "
                "no guard on an empty hook dict, so the graph is reused and never calls it (stale graph; "
                "torch._dynamo.reset() or registering before the first compiled call makes it run)",
                (label,),
            )
        )
    return out


def _wrappers(side: Side, keys: dict[int, HookKey], name: str) -> list[Reason]:
    """Global hooks that fired for torch.compile's wrapper (an OptimizedModule, which hooktrace names
    as the module it wraps: two calls of one path, one directly inside the other)."""
    events = side.trace.events
    found: dict[HookKey, Counter[str]] = {}
    open_at: list[tuple[Optional[str], int]] = []  # (path, index of its enter)
    outer: set[int] = set()  # indices of enters directly enclosing an enter of the same path
    for i, e in enumerate(events):
        if e.type == ENTER:
            if open_at and open_at[-1][0] == e.module and open_at[-1][1] == i - 1:
                outer.add(open_at[-1][1])
            open_at.append((e.module, i))
        elif e.type == EXIT and open_at:
            start = open_at.pop()[1]
            if start in outer:
                _global_after(events, i, keys, found, "torch.compile's wrapper")
    out = []
    for key, where in found.items():
        parts = ", ".join(f"{w} ({plural(n, 'call')})" for w, n in where.items())
        out.append(
            Reason(
                "wrapper_calls",
                f"in the {name} run the global hook {key.label()} also fired for {parts}: torch.compile(m) "
                "returns an OptimizedModule that is itself a module (hooktrace names it as the module it "
                "wraps: two calls of one path, one directly inside the other), so global module hooks "
                "fire once more per call than for the plain model; under force_eager too (m.compile() "
                "compiles in place, with no wrapper)",
                (key.label(),),
            )
        )
    return out


def _global_after(
    events: list[Event], exit_at: int, keys: dict[int, HookKey], found: dict[HookKey, Counter[str]], what: str
) -> None:
    """Global forward hooks that fired right before the exit at `exit_at` (for the call it closes)."""
    for e in reversed(events[:exit_at]):
        if e.type != HOOK or e.hook not in keys or keys[e.hook].scope != GLOBAL or e.kind != K.forward:
            break
        found.setdefault(keys[e.hook], Counter())[what] += 1


def _replayed(eager: Side, compiled: Side, ka: dict[int, HookKey], kb: dict[int, HookKey]) -> list[Reason]:
    """Saved-tensor pack hooks that the compiled run called after AOTAutograd's compiled forward
    returned, where the eager run called them among the modules' calls."""
    out = []
    for step in sorted({e.step for e in compiled.trace.events}):
        eb = [e for e in compiled.trace.events if e.step == step and e.phase == FORWARD]
        graph_exits = [i for i, e in enumerate(eb) if e.type == EXIT and e.module == GRAPH_MODULE]
        if not graph_exits:
            continue
        first_exit = graph_exits[0]
        packs = [
            (i, kb[e.hook]) for i, e in enumerate(eb) if e.type == HOOK and e.kind == K.pack and e.hook in kb
        ]
        if not packs or any(i < first_exit for i, _ in packs):
            continue
        ea = [e for e in eager.trace.events if e.step == step and e.phase == FORWARD]
        for key in dict.fromkeys(k for _, k in packs):
            in_a = [e for e in ea if e.type == HOOK and e.hook in ka and ka[e.hook] == key]
            inside = sorted({e.module for e in in_a if e.module not in (None, "")}, key=str)
            n_b = sum(1 for _, k in packs if k == key)
            if not in_a or (not inside and len(in_a) == n_b):
                continue
            among = f", among the calls of {', '.join(_place(m) for m in inside[:4])}" if inside else ""
            out.append(
                Reason(
                    "replayed_after_graph",
                    f"step {step}: the saved-tensor pack hook {key.label()} ran {len(in_a)} times in the eager "
                    f"forward{among}; in the compiled run {n_b} times, all after AOTAutograd's compiled "
                    "forward (GraphModule) returned: the graph runs as one autograd Function whose saved "
                    "tensors are packed when it ends, so the hook sees other tensors, at another time, "
                    "another number of times",
                    (key.label(),),
                )
            )
    return out


def _recompiles(compiled: Side, kb: dict[int, HookKey]) -> list[Reason]:
    """Graphs compiled in every step of the compiled run (Dynamo recompiled on each call), and the
    recompile limit when it was hit."""
    per_step = list(compiled.graphs_per_step)
    if compiled.limit is None:
        if len(per_step) < 3 or not all(per_step):  # a first compile, a recompile or two: usual
            return []
    elif sum(1 for n in per_step if n) < 2:
        return []
    counts = ", ".join(str(n) for n in per_step[:12]) + (", ..." if len(per_step) > 12 else "")
    text = (
        f"Dynamo compiled a new graph in step after step of the compiled run (graphs per step: {counts}): "
        "a guard failed on each call"
    )
    if compiled.limit is not None:
        python_from = _python_again(compiled, kb)
        text += (
            " until it hit config.recompile_limit; from then on it no longer compiles that code and the "
            "model runs eagerly" + python_from + f". Dynamo said: {compiled.limit}"
        )
        text += (
            ". A guard on something a hook changes on every call (a list it appends to, a counter) "
            "fails each time: keep such state out of what the compiled code reads, or mark the hook "
            "@torch.compiler.disable"
        )
    return [Reason("recompiles", text)]


def _python_again(compiled: Side, kb: dict[int, HookKey]) -> str:
    """`, its hooks as Python again from step N` when module hooks fired as Python only from a
    later step of the compiled run on."""
    steps = sorted(
        {
            e.step
            for e in compiled.trace.events
            if e.type == HOOK and e.hook in kb and getattr(e, "graph", None) is None
        }
    )
    first = min((e.step for e in compiled.trace.events), default=0)
    if steps and steps[0] > first:
        return f" (its hooks ran as Python again from step {steps[0]})"
    return ""
