"""DOT and SVG: the order hooks fired in, as a Graphviz graph, drawn from the call tree.

Clusters per step (when there are several), then per phase, then per module call or backward group
(`analysis.calltree`, the same nesting the tree shows). Each hook call is a node; edges join the
nodes in firing order (`seq`), across clusters. Runs of identical sibling blocks (12 transformer
layers, or steps with the same order) show once plus a "×N more" note, repeated calls of one hook
in a row are one node and saved-tensor hooks one node per block, unless `expand=True`. The legend
lists only what the picture uses. Times are left out: this is order.

Every label goes through `safe_text` (no control character, so the SVG stays well-formed XML and
`dot` accepts the DOT) and node ids are counters, never taken from the trace.
"""

from __future__ import annotations

import html
import re
import textwrap
from typing import Any, Optional

import graphviz

from ..analysis import calltree as ct
from ..analysis.calltree import CallTree, Node, SavedTensors
from ..analysis.counts import count
from ..analysis.hiding import hidden_of
from ..kinds import BACKWARD, FORWARD, GRAPH, OPTIMIZER_PHASE, OTHER, RECOMPUTE, TABLE, K
from ..kinds import FAMILIES as KIND_FAMILIES
from ..kinds import GLOBAL as GLOBAL_SCOPE
from ..schema import Event, Trace, is_internal_error
from .badges import (
    DRY_RUN_NOTE,
    badges,
    graph_title,
    hook_name,
    module_name,
    plural,
    short_error,
    site,
    split_surprises,
    title_target,
)
from .errors import RenderError
from .safe import safe_text

INSTALL_HINT = (
    "Graphviz's `dot` program is needed for SVG: install it with `apt-get install graphviz`, "
    "`brew install graphviz` or `conda install -c conda-forge graphviz`, or write --format dot instead"
)
FONT = "Helvetica"
PHASE_FILL = {
    FORWARD: "#f1f8f1",
    BACKWARD: "#eff3fb",
    RECOMPUTE: "#fff5e6",
    OPTIMIZER_PHASE: "#fbf3ea",
    OTHER: "#f4f4f4",
}
# family -> (fill, legend words, its kinds): one colour per family (kinds.FAMILIES), one legend entry
FAMILIES = {
    fam: (fill, words, tuple(k for k, info in TABLE.items() if info.family == fam))
    for fam, (words, fill) in KIND_FAMILIES.items()
}
FAMILY_OF = {k: fam for fam, (_, _, kinds) in FAMILIES.items() for k in kinds}
SAVED_FAMILY = FAMILY_OF[K.pack]  # a saved-tensors node (pack and unpack hooks) has its fill
OTHER_FILL = "#eeeeee"
PREPEND = {"fillcolor": "#ffd54f", "color": "#a67c00", "penwidth": "2"}
GLOBAL = {"fillcolor": "#b2ebf2", "color": "#00838f", "penwidth": "2"}
ERROR = {"fillcolor": "#ffcdd2", "color": "#d50000", "fontcolor": "#b71c1c", "penwidth": "2"}
# PyTorch's own caught exception (checkpoint stopping a recompute): dark text on a pale fill
STOPPED = {"fillcolor": "#fff3e0", "color": "#ef6c00", "fontcolor": "#8a3b00", "penwidth": "2"}
MORE = {
    "shape": "note",
    "style": "filled",
    "fillcolor": "#ffffff",
    "color": "#777777",
    "fontcolor": "#444444",
}
MAX_TEXT = 70
# Columns of one step, side by side: forward; backward with the recomputes it triggers; the optimizer.
COLUMN = {FORWARD: 0, OTHER: 0, BACKWARD: 1, RECOMPUTE: 1, OPTIMIZER_PHASE: 2}
ROW_MAX = 4  # a leaf module call with at most this many hook nodes draws them in one row
SURPRISES_SHOWN = 8  # surprise lines in the heading (alike ones, differing in layer numbers, count once)
PHASE_SHORT = {RECOMPUTE: RECOMPUTE, OPTIMIZER_PHASE: OPTIMIZER_PHASE}  # long titles go to the legend
PHASE_NOTES = {
    RECOMPUTE: "forward again during backward (checkpoint)",
    OPTIMIZER_PHASE: "inside optimizer.step()",
}


def _esc(text: str, limit: int = MAX_TEXT) -> str:
    """Text for a quoted DOT string: control characters made visible, backslashes and `&` literal
    (Graphviz reads `\\n` and `&amp;` in labels), cut to `limit` characters."""
    text = safe_text(text)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("\\", "\\\\").replace("&", "&amp;")


def _label(*lines: str) -> str:
    return graphviz.nohtml("\\n".join(lines))


class _Emitter:
    def __init__(self, tree: CallTree, expand: bool) -> None:
        self.tree = tree
        self.trace = tree.trace
        self.expand = expand
        self.hook_of = ct.hook_lookup(tree.trace)
        shown, self.info = split_surprises(list(tree.trace.surprises))
        self.surprises = shown
        self.rules: dict[int, list[str]] = {}
        for s in shown:
            for seq in s.events:
                if s.rule not in self.rules.setdefault(seq, []):
                    self.rules[seq].append(s.rule)
        self.chain: list[tuple[int, int, str, tuple[int, str]]] = []  # (seq, order, node id, (step, phase))
        self.ids = 0
        self.used: set[str] = set()  # legend entries the picture needs
        self.kinds: set[str] = set()  # kinds drawn

    def new_id(self, prefix: str) -> str:
        self.ids += 1
        return f"{prefix}{self.ids}"

    def link(self, seq: int, node_id: str, where: tuple[int, str]) -> None:
        self.chain.append((seq, len(self.chain), node_id, where))

    # -- nodes -----------------------------------------------------------------------------------
    def fire_node(self, g: graphviz.Digraph, events: list[Event], parent: Optional[str]) -> str:
        e, last = events[0], events[-1]
        h = self.hook_of(e.hook)
        kind = e.kind or (h.kind if h else "hook")  # not a kind: the word for an unknown one
        head = f"{kind}  #{e.seq}"
        if len(events) > 1:
            head += f"…#{last.seq}  ×{len(events)}"
        lines = [_esc(head), _esc(hook_name(h, e.hook))]
        if h is not None and h.tensor:
            lines.append(_esc(f"on {h.tensor}"))
        elif e.module is not None and e.module != parent:
            lines.append(_esc(f"for {module_name(e.module)}"))
        words = [w for w in badges(h, events) if w != "error"]
        if words:
            lines.append(_esc(" · ".join(words)))
        errors = [x.error for x in events if x.error is not None and not is_internal_error(x.error)]
        stops = [x.error for x in events if is_internal_error(x.error)]
        if errors:
            lines.append(_esc(f"error: {short_error(errors[0] or '')}"))
        elif stops:  # checkpoint's normal early stop: the tree's words, not an error
            lines.append(_esc(f"stopped by PyTorch: {short_error(stops[0] or '')}"))
        rules = [r for x in events for r in self.rules.get(x.seq, ())]
        if rules:
            lines.append(_esc("surprise: " + ", ".join(dict.fromkeys(rules))))
        family = FAMILY_OF.get(kind)
        attrs = {"fillcolor": FAMILIES[family][0] if family else OTHER_FILL}
        self.used.add(family or "other")  # not a kind: the family of kinds without one
        self.kinds.add(kind)
        if h is not None and h.scope == GLOBAL_SCOPE:
            attrs.update(GLOBAL)
            self.used.add(GLOBAL_SCOPE)
        if h is not None and h.prepend:
            attrs.update(PREPEND)
            self.used.add("prepend")
        if errors:
            attrs.update(ERROR)
            self.used.add("error")
        elif stops:
            attrs.update(STOPPED)
            self.used.add("stopped")
        tooltip = [f"hook id {e.hook}" if h is None else f"hook id {h.id}, {h.scope} {h.kind}"]
        if h is not None and h.defined_at:
            tooltip.append(f"defined at {site(h.defined_at)}")
        if h is not None and h.registered_at:
            tooltip.append(f"registered at {site(h.registered_at)}")
        node_id = self.new_id("h")
        g.node(node_id, _label(*lines), tooltip=_esc("; ".join(tooltip), 300), **attrs)
        self.link(e.seq, node_id, (e.step, e.phase))
        return node_id

    def saved_node(self, g: graphviz.Digraph, s: SavedTensors) -> str:
        counts = ", ".join(f"{n} {k}" for k, n in s.counts().items())
        names = ", ".join(dict.fromkeys(hook_name(self.hook_of(e.hook), e.hook) for e in s.events))
        lines = [_esc(f"saved tensors  #{s.seq}…#{s.last_seq}"), _esc(counts), _esc(names)]
        node_id = self.new_id("s")
        g.node(node_id, _label(*lines), fillcolor=FAMILIES[SAVED_FAMILY][0])
        self.used.add(SAVED_FAMILY)
        self.kinds.update(e.kind for e in s.events if e.kind)
        self.link(s.seq, node_id, (s.events[0].step, s.events[0].phase))
        return node_id

    def more_node(self, g: graphviz.Digraph, hidden: list[Node]) -> None:
        first, last = hidden[0], hidden[-1]
        fires = sum(b.hooks for b in hidden)
        if first.kind == "step":
            span = f"step {first.step}" if len(hidden) == 1 else f"steps {first.step}–{last.step}"
            what = f"×{len(hidden)} more step{'s' if len(hidden) != 1 else ''} with the same hook order"
        else:
            names = [module_name(b.module) for b in hidden]
            span = ", ".join(names) if len(names) <= 3 else f"{names[0]} … {names[-1]}"
            what = f"×{len(hidden)} more with the same hook order"
        node_id = self.new_id("more")
        g.node(node_id, _label(_esc(what), _esc(span), f"{fires} hook calls not drawn (--expand draws them)"),
               **MORE)  # fmt: skip
        self.used.add("more")
        self.link(first.first_seq, node_id, (first.step, first.phase))

    # -- clusters --------------------------------------------------------------------------------
    def children(self, g: graphviz.Digraph, node: Node) -> None:
        parent = node.module if node.kind in ("call", "group") else None
        pending: list[Event] = []
        leaves: list[str] = []  # hook nodes drawn straight into this cluster
        nested = False
        for item, same in ct.runs(node.children, self.expand):
            if type(item) is Event and pending and not self.expand and _same_call(pending[-1], item):
                pending.append(item)
                continue
            if pending:
                leaves.append(self.fire_node(g, pending, parent))
                pending = []
            if type(item) is Event:
                pending = [item]
            elif type(item) is SavedTensors:
                leaves.append(self.saved_node(g, item))
            else:
                nested = True
                self.cluster(g, item)
                if same:
                    self.more_node(g, same)
        if pending:
            leaves.append(self.fire_node(g, pending, parent))
        if node.kind in ("call", "group") and not nested and 1 < len(leaves) <= ROW_MAX:
            with g.subgraph() as row:  # a leaf call's few hooks side by side: the picture uses its width
                row.attr(rank="same")
                for node_id in leaves:
                    row.node(node_id)

    def cluster(self, g: graphviz.Digraph, node: Node) -> None:
        """Draw `node` as a cluster. Titles stay short and left-aligned (an exception goes into a
        node of its own, where the call ended), so the firing-order edges run beside them."""
        with g.subgraph(name=self.new_id("cluster_")) as c:
            # set every attribute: a cluster inherits the ones its parent cluster set
            attrs = {"style": "rounded,filled", "fillcolor": "white", "color": "#757575", "penwidth": "1",
                     "fontcolor": "black", "labeljust": "l", "fontsize": "10"}  # fmt: skip
            if node.kind == "step":
                title = f"step {node.step}"
                attrs.update(style="rounded,bold", color="#555555", penwidth="2", fontsize="12")
            elif node.kind == "phase":
                title = _esc(PHASE_SHORT.get(node.phase, node.phase))
                attrs.update(
                    fillcolor=PHASE_FILL.get(node.phase, PHASE_FILL[OTHER]), color="#9e9e9e", fontsize="11"
                )
                self.used.add(f"phase_{node.phase}")
            elif node.kind == GRAPH:  # one run of a compiled graph: its hooks, in program order
                title = _esc(graph_title(node.graph, node.phase))
                attrs.update(style="rounded,filled,dotted", color="#8e24aa", penwidth="2")
                self.used.add(GRAPH)
            else:
                mtype = self.tree.types.get(node.module) if node.module is not None else None
                title = _esc(module_name(node.module) + (f" ({mtype})" if mtype else ""))
                if node.kind == "group":
                    attrs["style"] = "rounded,filled,dashed"
                    self.used.add("group")
                if is_internal_error(node.error):
                    attrs.update(color=STOPPED["color"], fontcolor=STOPPED["fontcolor"], penwidth="2")
                elif node.error is not None:
                    attrs.update(color=ERROR["color"], fontcolor=ERROR["fontcolor"], penwidth="2")
            c.attr(label=_label(title), **attrs)
            self.children(c, node)
            if node.error is not None:  # the exception, as the last thing in the call, where it ended
                stopped = is_internal_error(node.error)
                self.used.add("stopped" if stopped else "error")
                marker = self.new_id("x")
                text = f"{'stopped by PyTorch' if stopped else 'raised'}: {short_error(node.error)}"
                style = {**(STOPPED if stopped else ERROR), "style": "rounded,filled"}
                c.node(marker, _label(_esc(text)), **style)
                self.link(node.last_seq, marker, (node.step, node.phase))

    def legend(self) -> list[str]:
        """Table cells (swatch, meaning) for what the picture uses, and only that."""
        entries: list[tuple[tuple[str, ...], dict[str, Any]]] = []
        for fam, (fill, text, kinds) in FAMILIES.items():
            if fam in self.used:
                drawn = [k for k in kinds if k in self.kinds] or list(kinds)
                entries.append(((", ".join(drawn), text), {"fillcolor": fill}))
        if "other" in self.used:  # not a kind: the family of kinds without one
            entries.append((("other kinds", "state-dict, registration hooks"), {"fillcolor": OTHER_FILL}))
        extra = [
            ("prepend", ("prepend", "registered with prepend=True, or proven first"), PREPEND),
            (GLOBAL_SCOPE, (GLOBAL_SCOPE, "global module hook (every module)"), GLOBAL),
            ("error", ("error", "the hook or module raised"), ERROR),
            ("stopped", ("stopped by PyTorch", "its own caught exception"), STOPPED),
            ("group", ("dashed box", "a module's hooks in backward, or under checkpoint"),
             {"style": "rounded,dashed", "fillcolor": "white"}),
            ("more", ("×N more", "identical blocks collapsed"), MORE),
            (GRAPH, ("dotted box", "a compiled graph's run: hooks in program order, no time"),
             {"style": "rounded,dotted", "fillcolor": "white", "color": "#8e24aa"}),
        ]  # fmt: skip
        entries += [(lines, attrs) for key, lines, attrs in extra if key in self.used]
        for phase, note in PHASE_NOTES.items():
            if f"phase_{phase}" in self.used:
                entries.append(((phase, note), {"fillcolor": PHASE_FILL[phase], "color": "#9e9e9e"}))
        cells = []
        for lines, attrs in entries:
            cell = [f'BGCOLOR="{attrs.get("fillcolor", "white")}"', f'COLOR="{attrs.get("color", "black")}"']
            if "dashed" in attrs.get("style", ""):
                cell.append('STYLE="dashed"')
            if attrs.get("penwidth") == "2":
                cell.append('BORDER="2"')
            word = f'<FONT POINT-SIZE="9">{html.escape(lines[0])}</FONT>'
            if attrs.get("fontcolor"):
                word = f'<FONT COLOR="{attrs["fontcolor"]}">{word}</FONT>'
            text = f'<FONT POINT-SIZE="9">{html.escape(lines[1])}</FONT>'
            cells.append(f'<TD {" ".join(cell)}>{word}</TD><TD BORDER="0" ALIGN="LEFT">{text}</TD>')
        return cells


def _same_call(a: Event, b: Event) -> bool:
    return (a.hook, a.kind, a.module, a.returned, a.error) == (b.hook, b.kind, b.module, b.returned, b.error)


def build_graph(trace: Trace, *, expand: bool = False) -> graphviz.Digraph:
    """The `graphviz.Digraph` of `trace`; `expand=True` draws every repeated block and call."""
    tree = ct.build(trace, expand=expand)
    em = _Emitter(tree, expand)
    counts = count(trace)
    n_steps = len({e.step for e in tree.events})
    target = title_target(trace.meta) or "trace"
    title = f"hooktrace: {target} · {counts.phrase()}"
    if counts.steps > 1:
        title += f" in {plural(counts.steps, 'step')}"
    if trace.meta.dry_run:
        title += f" · {DRY_RUN_NOTE}"
    if em.surprises:
        title += f" · surprises: {', '.join(dict.fromkeys(s.rule for s in em.surprises))}"
    if em.info:
        title += f" · +{em.info} info surprise{'s' if em.info != 1 else ''}"
    left_out = hidden_of(trace)
    if left_out is not None:
        title += f" · {left_out.phrase()}"

    g = graphviz.Digraph("hooktrace")
    # the heading at the top left: on screen where a browser opens a wide picture
    g.attr(fontname=FONT, fontsize="12", rankdir="TB", newrank="true", nodesep="0.25", ranksep="0.35",
           labelloc="t", labeljust="l")  # fmt: skip
    g.attr("node", shape="box", style="rounded,filled", fontname=FONT, fontsize="10", margin="0.08,0.04")
    g.attr("edge", color="#616161", arrowsize="0.6")
    if not tree.steps:
        g.node("empty", "no hook fired in this trace", shape="plaintext")
    elif n_steps == 1 and len(tree.steps) == 1:
        em.children(g, tree.steps[0])
    else:
        root = Node("step", tree.events[0])
        root.kind = "root"
        root.children = list(tree.steps)
        em.children(g, root)
    em.chain.sort()
    heads: dict[int, dict[int, str]] = {}  # step -> column -> its first node
    for _, _, node_id, (step, phase) in em.chain:
        heads.setdefault(step, {}).setdefault(COLUMN.get(phase, 0), node_id)
    for (_, _, a, wa), (_, _, b, wb) in zip(em.chain, em.chain[1:]):
        if wa[0] == wb[0] and COLUMN.get(wa[1], 0) != COLUMN.get(wb[1], 0):
            g.edge(a, b, constraint="false", style="dashed")  # into another column of the same step
        else:
            g.edge(a, b)
    for (
        columns
    ) in heads.values():  # a step's columns side by side, tops aligned (which one goes left is dot's choice)
        if len(columns) > 1:
            order = [columns[k] for k in sorted(columns)]
            with g.subgraph() as top:
                top.attr(rank="same")
                for node_id in order:
                    top.node(node_id)
            for a, b in zip(order, order[1:]):
                g.edge(a, b, style="invis")
    g.attr(label=_heading(title, em.legend(), _surprise_lines(em.surprises)))
    return g


_NUMBERED = re.compile(r"(?<=\.)\d+\b|\b\d+(?=\.[A-Za-z_])|(?<=#)\d+")


def _surprise_lines(surprises: list[Any]) -> list[str]:
    """`rule: message` per surprise shown, those differing only in numbered modules (layers.0 /
    layers.1) or seqs once with a count, at most SURPRISES_SHOWN of them."""
    groups: dict[tuple[str, str], list[Any]] = {}
    for s in surprises:
        groups.setdefault((s.rule, _NUMBERED.sub("N", s.message)), [s, 0])[1] += 1
    lines = []
    for first, alike in list(groups.values())[:SURPRISES_SHOWN]:
        more = f" (×{alike - 1} more like this)" if alike > 1 else ""
        lines.append(f"{first.rule}: {first.message}{more}")
    if len(groups) > SURPRISES_SHOWN:
        lines.append(
            f"… {len(groups) - SURPRISES_SHOWN} more kinds of surprise: hooktrace render shows them all"
        )
    return lines


def _wrapped(text: str, width: int = 120) -> str:
    """HTML-label text, wrapped at `width` columns into left-aligned lines."""
    return (
        '<BR ALIGN="LEFT"/>'.join(
            html.escape(line) for line in textwrap.wrap(_esc_html(text, 600), width) or [""]
        )
        + '<BR ALIGN="LEFT"/>'
    )


def _heading(title: str, cells: list[str], surprises: list[str] = (), per_row: int = 2) -> str:  # type: ignore[assignment]
    """The graph's label: the title, the surprises explained, and the legend (the graph label takes
    no rank, so none of it can stretch the drawing)."""
    # the title wrapped between its " · " parts (one long line made the picture wider than a screen);
    # a count or a note is never split
    lines: list[str] = []
    for part in title.split(" · "):
        if lines and len(lines[-1]) + 3 + len(part) <= 100:
            lines[-1] += " · " + part
        else:
            lines.append(part)
    text = '<BR ALIGN="LEFT"/>'.join(html.escape(_esc_html(line)) for line in lines)
    rows = [f'<TR><TD COLSPAN="{2 * per_row}" BORDER="0" ALIGN="LEFT"><B>{text}</B></TD></TR>']
    for line in surprises:
        rows.append(
            f'<TR><TD COLSPAN="{2 * per_row}" BORDER="1" COLOR="#b7791f" BGCOLOR="#fff6e0" ALIGN="LEFT">'
            f'<FONT POINT-SIZE="10">{_wrapped(line)}</FONT></TD></TR>'
        )
    for i in range(0, len(cells), per_row):
        rows.append("<TR>" + "".join(cells[i : i + per_row]) + "</TR>")
    table = '<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="3" CELLPADDING="3">' + "".join(rows) + "</TABLE>"
    return f"<{table}>"


def _esc_html(text: str, limit: int = 200) -> str:
    text = safe_text(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
        stderr = exc.stderr or b""
        text = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else str(stderr)
        detail = text.strip().splitlines()
        raise RenderError(f"Graphviz dot failed: {safe_text(detail[-1]) if detail else exc}") from None
