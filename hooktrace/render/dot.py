"""DOT and SVG: the order hooks fired in, as a Graphviz graph. A pure function of a `Trace`.

Clusters per step (when there are several), then per phase, then per module call (forward and
recompute nest by `enter`/`exit`; backward has no module calls, so a run of one module's hooks is
a group, nested under an ancestor's group while that one is open). Each hook call is a node; edges
join the nodes in firing order (`seq`), across clusters. Consecutive identical sibling blocks (12
transformer layers, or steps with the same order) show once plus a "×N more" node, and repeated
calls of one hook in a row are one node, unless `expand=True`. Times are left out: this is order.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import graphviz

from ..analysis.surprises import is_internal_error
from ..schema import ROOT, Event, Hook, Trace
from . import RenderError

INSTALL_HINT = (
    "Graphviz's `dot` program is needed for SVG: install it with `apt-get install graphviz`, "
    "`brew install graphviz` or `conda install -c conda-forge graphviz`, or write --format dot instead"
)
FONT = "Helvetica"
PHASE_TITLES = {
    "forward": "forward",
    "backward": "backward",
    "recompute": "recompute (forward again during backward)",
    "other": "other",
}
PHASE_FILL = {"forward": "#f1f8f1", "backward": "#eff3fb", "recompute": "#fff5e6", "other": "#f4f4f4"}
KIND_FILL = {
    "forward_pre": "#e8f5e9",
    "forward": "#c8e6c9",
    "backward_pre": "#e3ecf8",
    "backward": "#c5d8f0",
    "backward_legacy": "#f6d5c1",
    "grad": "#f1e4f5",
    "post_accumulate_grad": "#e6d3ee",
}
DEFAULT_FILL = "#eeeeee"
PREPEND = {"fillcolor": "#ffd54f", "color": "#a67c00", "penwidth": "2"}
GLOBAL = {"fillcolor": "#b2ebf2", "color": "#00838f", "penwidth": "2"}
ERROR = {"fillcolor": "#ffcdd2", "color": "#d50000", "fontcolor": "#b71c1c", "penwidth": "2"}
STOPPED = {"color": "#ef6c00", "fontcolor": "#e65100", "penwidth": "2"}  # PyTorch's own, caught exception
MORE = {
    "shape": "note",
    "style": "filled",
    "fillcolor": "#ffffff",
    "color": "#777777",
    "fontcolor": "#444444",
}
MAX_TEXT = 70


# -- the nested structure ------------------------------------------------------------------------
class _Fire:
    """One node: a hook call, or several calls of the same hook in a row."""

    __slots__ = ("events", "sig")

    def __init__(self, e: Event) -> None:
        self.events = [e]
        self.sig = 0


class _Block:
    """A step, a phase, a module call (`call`, from enter/exit) or a group of one module's hooks."""

    __slots__ = ("kind", "module", "phase", "step", "seq", "children", "error", "sig", "fires", "closing")

    def __init__(self, kind: str, e: Event, module: Optional[str] = None) -> None:
        self.kind = kind
        self.module = module
        self.phase = e.phase
        self.step = e.step
        self.seq = e.seq  # the event that opened it
        self.children: list[Union[_Block, _Fire]] = []
        self.error: Optional[str] = None
        self.sig = 0
        self.fires = 0  # hook calls below, after pruning
        # a group whose module's `backward` hook fired: its next `backward_pre` opens a new group
        self.closing = False


def _contains(outer: Optional[str], inner: Optional[str]) -> bool:
    if outer is None or inner is None:
        return False
    return outer == "" or inner == outer or inner.startswith(outer + ".")


def _rel(child: Optional[str], parent: Optional[str]) -> Optional[str]:
    """`child` relative to `parent`, so that layers.0.fc and layers.1.fc compare equal."""
    if child is None or parent is None:
        return child
    if child == parent:
        return ""
    if parent == "":
        return child
    if child.startswith(parent + "."):
        return child[len(parent) + 1 :]
    return child


class _PhaseBuilder:
    """Nesting of one (step, phase), with one open-block stack per thread."""

    def __init__(self, root: _Block, expand: bool) -> None:
        self.root = root
        self.expand = expand
        self.stacks: dict[int, list[_Block]] = {}

    def _top(self, stack: list[_Block]) -> _Block:
        return stack[-1] if stack else self.root

    def _close_groups(self, stack: list[_Block], module: str) -> None:
        while stack and stack[-1].kind == "group" and not _contains(stack[-1].module, module):
            stack.pop()

    def enter(self, e: Event) -> None:
        stack = self.stacks.setdefault(e.thread, [])
        self._close_groups(stack, e.module or "")
        block = _Block("call", e, e.module)
        self._top(stack).children.append(block)
        stack.append(block)

    def exit(self, e: Event) -> None:
        stack = self.stacks.setdefault(e.thread, [])
        for i in range(len(stack) - 1, -1, -1):
            if stack[i].kind == "call" and stack[i].module == e.module:
                stack[i].error = e.error
                del stack[i:]
                return
        if e.error is not None:  # an exit without its enter still shows its exception
            block = _Block("call", e, e.module)
            block.error = e.error
            self._top(stack).children.append(block)

    def hook(self, e: Event) -> None:
        stack = self.stacks.setdefault(e.thread, [])
        module = e.module
        if module is not None:
            self._close_groups(stack, module)
            top = self._top(stack)
            if top.kind == "group" and top.module == module and top.closing and e.kind == "backward_pre":
                stack.pop()  # the same module's next call in backward
                top = self._top(stack)
            if top.module != module or top.kind not in ("call", "group"):
                group = _Block("group", e, module)
                top.children.append(group)
                stack.append(group)
        block = self._top(stack)
        if block.kind == "group" and e.kind in ("backward", "backward_legacy") and block.module == module:
            block.closing = True
        last = block.children[-1] if block.children else None
        if not self.expand and type(last) is _Fire and _same_call(last.events[-1], e):
            last.events.append(e)
        else:
            block.children.append(_Fire(e))


def _same_call(a: Event, b: Event) -> bool:
    return (a.hook, a.kind, a.module, a.returned, a.error) == (b.hook, b.kind, b.module, b.returned, b.error)


def _build(trace: Trace, expand: bool) -> list[_Block]:
    """Step blocks (sorted by step), each holding its phase blocks in order of first appearance."""
    steps: dict[int, _Block] = {}
    builders: dict[tuple[int, str], _PhaseBuilder] = {}
    for e in sorted(trace.events, key=lambda ev: ev.seq):
        builder = builders.get((e.step, e.phase))
        if builder is None:
            step = steps.get(e.step)
            if step is None:
                step = steps[e.step] = _Block("step", e)
            phase = _Block("phase", e)
            step.children.append(phase)
            builder = builders[(e.step, e.phase)] = _PhaseBuilder(phase, expand)
        if e.type == "enter":
            builder.enter(e)
        elif e.type == "exit":
            builder.exit(e)
        else:
            builder.hook(e)
    return [steps[s] for s in sorted(steps)]


class _Shapes:
    """Signatures: equal when two blocks ran the same hooks in the same order, whatever their path."""

    def __init__(self, trace: Trace, hook_of: Any) -> None:
        self.types = {m.path: m.type for m in trace.modules}
        self.hook_of = hook_of
        self.ids: dict[Any, int] = {}

    def intern(self, key: Any) -> int:
        return self.ids.setdefault(key, len(self.ids) + 1)

    def fire(self, f: _Fire, parent: Optional[str]) -> int:
        e = f.events[0]
        h: Optional[Hook] = self.hook_of(e.hook)
        what = (h.name, h.defined_at, h.scope, h.prepend, h.with_kwargs, h.always_call) if h else (e.hook,)
        tensor = _rel_tensor(h.tensor, parent) if h is not None else None
        return self.intern(
            ("f", e.kind, what, tensor, _rel(e.module, parent), e.returned, e.error, len(f.events))
        )

    def finish(self, block: _Block) -> bool:
        """Prune hookless blocks and compute signatures, children first. True when `block` is kept."""
        parent = block.module if block.kind in ("call", "group") else None
        kept: list[Union[_Block, _Fire]] = []
        parts: list[Any] = []
        fires = 0
        for c in block.children:
            if type(c) is _Fire:
                c.sig = self.fire(c, parent)
                fires += len(c.events)
                parts.append(c.sig)
                kept.append(c)
            elif self.finish(c):
                fires += c.fires
                parts.append((_rel(c.module, parent), c.sig))
                kept.append(c)
        block.children = kept
        block.fires = fires
        mtype = self.types.get(block.module) if block.module is not None else None
        block.sig = self.intern((block.kind, block.phase, mtype, block.error, tuple(parts)))
        return fires > 0 or block.error is not None


def _rel_tensor(tensor: Optional[str], parent: Optional[str]) -> Optional[str]:
    if tensor is None or not parent:
        return tensor
    return tensor.replace(parent + ".", "", 1)


# -- DOT -----------------------------------------------------------------------------------------
def _esc(text: str, limit: int = MAX_TEXT) -> str:
    """Plain text for a quoted DOT string: backslashes kept literal, long text cut."""
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("\\", "\\\\")


def _err(error: str) -> str:
    """`"Type: message"`, or just `"Type"` when the message is empty."""
    return error.rstrip().rstrip(":")


def _label(*lines: str) -> str:
    return graphviz.nohtml("\\n".join(lines))


class _Emitter:
    def __init__(self, trace: Trace, expand: bool) -> None:
        self.trace = trace
        self.expand = expand
        self.types = {m.path: m.type for m in trace.modules}
        self.hooks: dict[int, Optional[Hook]] = {}
        self.rules: dict[int, list[str]] = {}
        for s in trace.surprises:
            for seq in s.events:
                if s.rule not in self.rules.setdefault(seq, []):
                    self.rules[seq].append(s.rule)
        self.chain: list[tuple[int, str]] = []  # (seq, node id) of every node, joined in seq order
        self.clusters = 0

    def hook_of(self, hook_id: Optional[int]) -> Optional[Hook]:
        if hook_id is None:
            return None
        if hook_id not in self.hooks:
            try:
                self.hooks[hook_id] = self.trace.hook(hook_id)
            except KeyError:
                self.hooks[hook_id] = None
        return self.hooks[hook_id]

    def cluster_name(self) -> str:
        self.clusters += 1
        return f"cluster_{self.clusters}"

    # -- nodes -----------------------------------------------------------------------------------
    def fire_node(self, g: graphviz.Digraph, f: _Fire, parent: Optional[str]) -> None:
        e, last = f.events[0], f.events[-1]
        h = self.hook_of(e.hook)
        kind = e.kind or (h.kind if h else "hook")
        head = f"{kind}  #{e.seq}"
        if len(f.events) > 1:
            head += f"…#{last.seq}  ×{len(f.events)}"
        lines = [_esc(head), _esc(h.name if h else f"<unknown hook {e.hook}>")]
        if h is not None and h.scope == "tensor" and h.tensor:
            lines.append(_esc(f"on {h.tensor}"))
        elif e.module is not None and e.module != parent:
            lines.append(_esc(f"for {e.module or ROOT}"))
        badges = _badges(h, f.events)
        if badges:
            lines.append(_esc(" · ".join(badges)))
        errors = [x.error for x in f.events if x.error is not None and not is_internal_error(x.error)]
        stops = [x.error for x in f.events if is_internal_error(x.error)]
        if errors or stops:
            lines.append(_esc(f"error: {_err((errors or stops)[0])}"))
        rules = [r for x in f.events for r in self.rules.get(x.seq, ())]
        if rules:
            lines.append(_esc("surprise: " + ", ".join(dict.fromkeys(rules))))
        attrs = {"fillcolor": KIND_FILL.get(kind, DEFAULT_FILL)}
        if h is not None and h.scope == "global":
            attrs.update(GLOBAL)
        if h is not None and h.prepend:
            attrs.update(PREPEND)
        if errors:
            attrs.update(ERROR)
        elif stops:
            attrs.update(STOPPED)
        tooltip = [f"hook id {e.hook}" if h is None else f"hook id {h.id}, {h.scope} {h.kind}"]
        if h is not None and h.defined_at:
            tooltip.append(f"defined at {h.defined_at}")
        if h is not None and h.registered_at:
            tooltip.append(f"registered at {h.registered_at}")
        node_id = f"e{e.seq}"
        g.node(node_id, _label(*lines), tooltip=_esc("; ".join(tooltip), 300), **attrs)
        self.chain.append((e.seq, node_id))

    def more_node(self, g: graphviz.Digraph, hidden: list[_Block]) -> None:
        first, last = hidden[0], hidden[-1]
        fires = sum(b.fires for b in hidden)
        if first.kind == "step":
            span = f"step {first.step}" if len(hidden) == 1 else f"steps {first.step}–{last.step}"
            what = f"×{len(hidden)} more step{'s' if len(hidden) != 1 else ''} with the same hook order"
        else:
            names = [_name(b) for b in hidden]
            span = ", ".join(names) if len(names) <= 3 else f"{names[0]} … {names[-1]}"
            what = f"×{len(hidden)} more with the same hook order"
        node_id = f"more{first.seq}"
        g.node(
            node_id,
            _label(_esc(what), _esc(span), f"{fires} hook calls not drawn (--expand draws them)"),
            **MORE,
        )
        self.chain.append((first.seq, node_id))

    # -- clusters --------------------------------------------------------------------------------
    def children(self, g: graphviz.Digraph, block: _Block) -> None:
        parent = block.module if block.kind in ("call", "group") else None
        kids = block.children
        i, n = 0, len(kids)
        while i < n:
            c = kids[i]
            if type(c) is _Fire:
                self.fire_node(g, c, parent)
                i += 1
                continue
            j = i + 1
            if not self.expand and c.kind != "phase":
                while j < n and type(kids[j]) is _Block and kids[j].sig == c.sig:
                    j += 1
            if c.kind != "step" and j - i == 2:
                j = i + 1  # one identical sibling is drawn: a "×1 more" note would hide it for nothing
            self.cluster(g, c)
            if j - i > 1:
                self.more_node(g, kids[i + 1 : j])  # type: ignore[arg-type]
            i = j

    def cluster(self, g: graphviz.Digraph, block: _Block) -> None:
        with g.subgraph(name=self.cluster_name()) as c:
            # set every attribute: a cluster inherits the ones its parent cluster set
            attrs = {"style": "rounded,filled", "fillcolor": "white", "color": "#757575"}
            attrs.update(penwidth="1", fontcolor="black")
            if block.kind == "step":
                lines = [f"step {block.step}"]
                attrs.update(style="rounded,bold", color="#555555", penwidth="2")
            elif block.kind == "phase":
                lines = [_esc(PHASE_TITLES.get(block.phase, block.phase))]
                attrs.update(fillcolor=PHASE_FILL.get(block.phase, "#f4f4f4"), color="#9e9e9e")
            else:
                mtype = self.types.get(block.module or "")
                lines = [_esc(_name(block) + (f" ({mtype})" if mtype else ""))]
                if block.kind == "group":
                    attrs["style"] = "rounded,filled,dashed"
                if is_internal_error(block.error):
                    lines.append(_esc(f"stopped by PyTorch: {_err(block.error)}"))
                    attrs.update(STOPPED)
                elif block.error is not None:
                    lines.append(_esc(f"raised {_err(block.error)}"))
                    attrs.update(color=ERROR["color"], fontcolor=ERROR["fontcolor"], penwidth="2")
            c.attr(label=_label(*lines), **attrs)
            if block.error is not None and not block.children:
                node_id = f"x{block.seq}"
                style = STOPPED if is_internal_error(block.error) else ERROR
                c.node(node_id, _label(_esc(f"raised {_err(block.error)}")), **style, style="filled")
                self.chain.append((block.seq, node_id))
            self.children(c, block)

    def legend(self, g: graphviz.Digraph) -> None:
        with g.subgraph(name="cluster_legend") as c:
            c.attr(label="legend", style="rounded", color="#bdbdbd", fontsize="10")
            entries = [
                (
                    "legend_module",
                    ("forward_pre  #seq", "module hook"),
                    {"fillcolor": KIND_FILL["forward_pre"]},
                ),
                ("legend_prepend", ("prepend", "registered with prepend=True"), PREPEND),
                ("legend_global", ("global", "register_module_* hook"), GLOBAL),
                ("legend_tensor", ("grad", "tensor hook"), {"fillcolor": KIND_FILL["grad"]}),
                ("legend_error", ("error", "the hook or module raised"), ERROR),
                (
                    "legend_stopped",
                    ("stopped", "PyTorch's own caught exception"),
                    {**STOPPED, "fillcolor": "white"},
                ),
            ]
            for node_id, lines, attrs in entries:
                c.node(node_id, _label(*lines), **attrs)
            c.node("legend_more", _label("×N more", "identical blocks collapsed"), **MORE)
            ids = [e[0] for e in entries] + ["legend_more"]
            for a, b in zip(ids, ids[1:]):
                c.edge(a, b, style="invis")


def _badges(h: Optional[Hook], events: list[Event]) -> list[str]:
    out: list[str] = []
    if h is not None:
        if h.prepend:
            out.append("prepend" + (" (inferred)" if h.prepend_source == "inferred" else ""))
        if h.scope == "global":
            out.append("global")
        if h.with_kwargs:
            out.append("with_kwargs")
        if h.always_call:
            out.append("always_call")
        if h.registered_during_run:
            out.append("registered during run")
    if any(e.returned for e in events):
        out.append("returned")
    return out


def _name(block: _Block) -> str:
    if block.module is None:
        return "tensor hooks"
    return block.module or ROOT


def build_graph(trace: Trace, *, expand: bool = False) -> graphviz.Digraph:
    """The `graphviz.Digraph` of `trace`; `expand=True` draws every repeated block and call."""
    em = _Emitter(trace, expand)
    steps = _build(trace, expand)
    shapes = _Shapes(trace, em.hook_of)
    steps = [s for s in steps if shapes.finish(s)]
    n_hooks = sum(s.fires for s in steps)
    target = trace.meta.target or "trace"
    n_steps = len({e.step for e in trace.events})
    title = f"hooktrace: {target} · {n_hooks} hook call{'s' if n_hooks != 1 else ''}"
    if n_steps > 1:
        title += f" in {n_steps} steps"
    if trace.surprises:
        title += f" · surprises: {', '.join(dict.fromkeys(s.rule for s in trace.surprises))}"

    g = graphviz.Digraph("hooktrace")
    g.attr(
        label=_label(_esc(title, 200)),
        labelloc="t",
        fontname=FONT,
        fontsize="12",
        rankdir="TB",
        newrank="true",
        nodesep="0.25",
        ranksep="0.3",
    )
    g.attr("node", shape="box", style="rounded,filled", fontname=FONT, fontsize="10", margin="0.08,0.04")
    g.attr("edge", color="#616161", arrowsize="0.6")
    if not steps:
        g.node("empty", "no hook fired in this trace", shape="plaintext")
    elif len(steps) == 1:
        em.children(g, steps[0])
    else:
        root = _Block("root", trace.events[0])
        root.children = list(steps)
        em.children(g, root)
    em.chain.sort()
    for (_, a), (_, b) in zip(em.chain, em.chain[1:]):
        g.edge(a, b)
    em.legend(g)
    return g


def dot_source(trace: Trace, *, expand: bool = False) -> str:
    """DOT text of `trace` (see `build_graph`)."""
    return build_graph(trace, expand=expand).source


def svg(trace: Trace, *, expand: bool = False) -> str:
    """SVG laid out by Graphviz's `dot`; RenderError saying how to install it when it is missing."""
    graph = build_graph(trace, expand=expand)
    try:
        return graph.pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound:
        raise RenderError(INSTALL_HINT) from None
    except graphviz.CalledProcessError as exc:
        detail = (exc.stderr or b"").decode("utf-8", "replace").strip().splitlines()
        raise RenderError(f"Graphviz dot failed: {detail[-1] if detail else exc}") from None
