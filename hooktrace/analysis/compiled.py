"""The `compiled` surprise: hooks that ran inside code torch.compile made, so no Python call of
theirs was seen. The capture records which module calls ran compiled (capture/build.py
`compiled_windows`); this says which hooks of those modules the trace cannot show one by one.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from .. import kinds
from ..kinds import GLOBAL, HOOK, MODULE, K
from ..schema import ROOT, Surprise, Trace

# Kinds that run around a module call: under torch.compile, inside the compiled code or as Python.
_CALL_KINDS = frozenset((*kinds.MODULE_KINDS, K.forward_wrapper))
_FORWARD_KINDS = frozenset((*kinds.FORWARD_KINDS, K.forward_wrapper))

Windows = Mapping[Optional[str], Sequence[tuple[int, int]]]
# module path -> the hook ids Dynamo compiled into each graph compiled in its calls, in program order
Graphs = Mapping[Optional[str], Sequence[Sequence[int]]]


def compiled(trace: Trace, windows: Windows, graphs: Optional[Graphs] = None) -> list[Surprise]:
    """A `compiled` surprise per module that ran compiled, naming the hooks that were not seen.

    `windows`: module path (None: outside the model) -> (enter, exit) event seqs of its compiled
    calls. Hooks that ran as Python (the module calls after a graph break, full backward hooks in
    backward) are traced as usual; the surprise lists only the module-call hooks of the compiled
    module and its submodules that were not seen firing: forward kinds with no event inside its
    compiled calls, backward kinds with no event at all. They ran inside the compiled code or not at all.
    """
    if not windows:
        return []
    fired: dict[int, list[int]] = {}
    for e in trace.events:
        if e.type == HOOK and e.hook is not None:
            fired.setdefault(e.hook, []).append(e.seq)
    out = []
    for path, spans in windows.items():
        label = ROOT if path == "" else (path if path is not None else "a module outside the model")
        hidden = []
        for h in trace.hooks:
            if h.kind not in _CALL_KINDS or not (
                h.scope == GLOBAL or (h.scope == MODULE and _under(h.module, path))
            ):
                continue
            seqs = fired.get(h.id, ())
            if h.kind in _FORWARD_KINDS:
                seen = any(a < s < b for s in seqs for a, b in spans)
            else:
                seen = bool(seqs)
            if not seen:
                hidden.append(h.id)
        if not hidden:
            continue  # every hook of it ran as Python and is traced: nothing to say
        n, k = len(spans), len(hidden)
        if graphs is not None and not graphs.get(path):
            out.append(_before(label, n, hidden, spans))
            continue
        order = _graph_order(trace, graphs, path)
        out.append(
            Surprise(
                rule="compiled",
                message=(
                    f"`{label}` ran compiled by torch.compile ({n} call{'s' if n != 1 else ''}): {k} hook"
                    f"{'s' if k != 1 else ''} of it and its submodules did not fire as Python calls, so "
                    f"{'they are' if k != 1 else 'it is'} not traced one by one: "
                    f"{'they' if k != 1 else 'it'} ran inside the compiled code (in its graph, or called from it), "
                    "or not at all "
                    "(trace the eager model to see their order). Hooks that ran as Python (after a "
                    "graph break, in backward) are traced as usual" + order
                ),
                hooks=hidden,
                events=[enter for enter, _ in spans if enter != -1],
            )
        )
    return out


def _before(label: str, n: int, hidden: list[int], spans: Sequence[tuple[int, int]]) -> Surprise:
    """The surprise of a module whose compiled calls ran a graph Dynamo compiled before the capture:
    the capture saw every graph compiled during it (with no hook too), and none in its calls."""
    k = len(hidden)
    return Surprise(
        rule="compiled",
        message=(
            f"compiled before tracing began: `{label}` ran code torch.compile compiled before the "
            f"capture started ({n} call{'s' if n != 1 else ''}; Dynamo compiled no graph of it while "
            f"tracing, so it reused one it had cached): {k} hook{'s' if k != 1 else ''} of it and its "
            f"submodules did not fire as Python calls; {'they' if k != 1 else 'it'} ran inside that "
            "graph, or not at all, and which hooks it runs, in what order, is not known. Start tracing "
            "before the first compiled call (or call torch._dynamo.reset() first) to see them as hook "
            "events. Hooks that ran as Python (after a graph break, in backward) are traced as usual"
        ),
        hooks=hidden,
        events=[enter for enter, _ in spans if enter != -1],
    )


def _graph_order(trace: Trace, graphs: Optional[Graphs], path: Optional[str]) -> str:
    """What the capture saw Dynamo compile into the graphs of `path`'s calls, as a sentence."""
    if graphs is None:
        return ""
    mine = [ids for ids in graphs.get(path, ()) if ids]
    if not mine:
        return (
            ". The graphs Dynamo compiled in its calls while tracing hold none of these hooks (a hook "
            "registered after its graph was compiled is in no graph, pytorch/pytorch#117758)"
        )
    hooks = {h.id: h for h in trace.hooks}
    parts = []
    for i, ids in enumerate(mine):
        names = " → ".join(
            f"`{hooks[j].name}` ({hooks[j].kind} on {_label(hooks[j].module)})" for j in ids if j in hooks
        )
        parts.append(f"graph {i + 1}: {names}" if len(mine) > 1 else names)
    return (
        ". Dynamo compiled these hook calls into its graph"
        + ("s" if len(mine) > 1 else "")
        + ", in program order, which each compiled call runs: "
        + "; ".join(parts)
    )


def _label(module: Optional[str]) -> str:
    return ROOT if module == "" else (f"`{module}`" if module is not None else "every module (global)")


def _under(module: Optional[str], path: Optional[str]) -> bool:
    if path is None:
        return False
    return module is not None and (path == "" or module == path or module.startswith(path + "."))


def _place(h: Any) -> str:
    if h.tensor:
        return h.tensor
    if h.module is not None:
        return ROOT if h.module == "" else f"`{h.module}`"
    return "an autograd node"


def _steps(steps: Sequence[int]) -> str:
    distinct = sorted(set(steps))
    if len(distinct) > 3:
        return f"{distinct[0]}–{distinct[-1]}"
    return ", ".join(str(s) for s in distinct)
