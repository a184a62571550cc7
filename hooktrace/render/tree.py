"""The rich tree: hooktrace's default output, drawn from the call tree (`analysis.calltree`).

(step, when there are several) -> phase -> module calls nested as they happened, each hook on one
line with its seq, kind, name, badges and where it is defined; then the surprises and a summary.
Lines are laid out for the width they are printed at: a line that would not fit moves its badges,
location or error to an indented continuation line instead of letting the terminal cut a word.
Every reading of the tree top to bottom is in `seq` order. Text from user code or a trace file
goes through `safe_text`, so no control sequence reaches the terminal.
"""

from __future__ import annotations

import io
import re
from typing import Any, Iterator, Optional

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.panel import Panel
from rich.text import Text
from rich.tree import Tree

from ..analysis import calltree as ct
from ..analysis.calltree import CallTree, Node, SavedTensors
from ..analysis.counts import count
from ..analysis.hiding import hidden_of, hide
from ..io import gc_paused
from ..kinds import ENTER, GLOBAL, GRAPH, HOOK, PHASES, TABLE, K
from ..options import UsageError, module_path
from ..schema import Event, Trace, is_internal_error
from .badges import (
    DRY_RUN_NOTE,
    FIRST_CALL,
    PHASE_TITLES,
    badges,
    first_call_traced,
    fmt_ns,
    graph_title,
    hook_name,
    info_line,
    location,
    module_name,
    plural,
    short_error,
    split_surprises,
    times_note,
    user_site,
)
from .errors import RenderError
from .safe import safe_text

KIND_STYLES = {name: k.style for name, k in TABLE.items() if k.style is not None}
BADGE_STYLES = {"prepend": "bold yellow", GLOBAL: "bold cyan", "returned": "magenta", "error": "bold red"}
KIND_WIDTH = 13
GUIDE = 4  # columns rich's tree indents each level by
CONT = "   "  # indent of a continuation line


def _pack(segments: list[tuple[str, Text]], avail: int) -> Text:
    """Segments (separator, text) on as few lines as fit in `avail` columns; a segment is never split
    (one longer than a whole line is left to the terminal)."""
    lines: list[Text] = []
    cur: Optional[Text] = None
    for sep, seg in segments:
        if cur is None:
            cur = seg.copy()
        elif cell_len(cur.plain) + len(sep) + cell_len(seg.plain) <= avail:
            cur.append(sep)
            cur.append_text(seg)
        else:
            lines.append(cur)
            cur = Text(CONT) + seg
    lines.append(cur or Text())
    return Text("\n").join(lines)


def shapes_segments(shapes: str) -> list[tuple[str, Text]]:
    """`--shapes` text in segments that `_pack` wraps: split after each `, ` (a tensor's own text has
    none: `f32[2,7,32] cpu`), and before ` -> ` (what the hook returned)."""
    received, arrow, returned = safe_text(shapes).partition(" -> ")
    parts = received.split(", ")
    words = [p + "," for p in parts[:-1]] + [parts[-1]]
    if arrow:
        words.append(f"-> {returned}")
    return [(" " if i else "", Text((CONT if i == 0 else "") + w, style="cyan")) for i, w in enumerate(words)]


def _fit_path(path: str, avail: int) -> str:
    """`path` (`file:line`), its middle folders cut (`torch/…/checkpoint_activation.py:114`) when
    it would not fit in `avail` columns on a line of its own."""
    if cell_len(path) <= avail or path.count("/") < 2:
        return path
    head, _, rest = path.partition("/")
    return f"{head}/…/{rest.rsplit('/', 1)[-1]}"


class _Drawer:
    """Per-call drawing state; nothing is kept between renderings."""

    def __init__(self, tree: CallTree, *, width: int, expand: bool, times: bool, depth: Optional[int],
                 top: int = 1):  # fmt: skip
        self.ctree = tree
        self.top = top  # the level of a phase's outermost calls: 0 under --module (depth counts from it)
        self.meta = tree.trace.meta
        self.width = width
        self.expand = expand
        self.times = times
        self.depth = depth
        self.hook_of = ct.hook_lookup(tree.trace)

    def hook_line(self, e: Event, parent: Optional[str], col: int) -> Text:
        h = self.hook_of(e.hook)
        head = Text()
        head.append(f"#{e.seq} ", style="dim")
        kind = safe_text(e.kind or (h.kind if h else "hook"))  # not a kind: the word for an unknown one
        head.append(kind.ljust(KIND_WIDTH), style=KIND_STYLES.get(kind, "white"))
        head.append(" ")
        head.append(hook_name(h, e.hook), style="bold")
        segs: list[tuple[str, Text]] = [("", head)]
        if h is not None and h.tensor:
            segs.append((" ", Text(f"on {safe_text(h.tensor)}")))
        elif e.module is not None and e.module != parent:
            segs.append((" ", Text(f"for {module_name(e.module)}")))
        words = badges(h, [e])
        if words:
            b = Text("[")
            for i, w in enumerate(words):
                b.append(", " if i else "")
                b.append(w, style=BADGE_STYLES.get(w.split()[0], "blue"))
            b.append("]")
            segs.append((" ", b))
        if self.times and e.graph is None:  # a hook inside a graph has no time of its own
            segs.append(("  ", Text(fmt_ns(e.duration_ns), style="dim")))
        where = location(h.defined_at, self.meta) if h is not None else ""
        if where:
            where = _fit_path(where, self.width - col - len(CONT))
            segs.append(("  ", Text(where, style="dim")))
        by = user_site(h)
        if by is not None:  # a hook defined elsewhere: the user's line that registered it
            segs.append(("  ", Text(f"registered by {location(by, self.meta)}", style="dim")))
        if is_internal_error(e.error):  # checkpoint stopping its recompute early: normal, not an error
            segs.append(("  ", Text(f"stopped by PyTorch: {short_error(e.error or '')}", style="yellow")))
        elif e.error is not None:
            segs.append(("  ", Text(f"error: {short_error(e.error)}", style="red")))
        line = _pack(segs, self.width - col)
        if e.shapes is not None:  # on a line of its own, under the hook: what it received and returned
            line.append("\n")
            line.append_text(_pack(shapes_segments(e.shapes), self.width - col))
        return line

    def saved_line(self, s: SavedTensors, col: int) -> Text:
        counts = ", ".join(f"{n} {k}" for k, n in s.counts().items())
        names = list(dict.fromkeys(hook_name(self.hook_of(e.hook), e.hook) for e in s.events))
        head = Text(f"#{s.seq}–#{s.last_seq} ", style="dim")
        head.append("saved tensors", style=KIND_STYLES[K.pack])
        head.append(f" {counts}")
        segs = [("", head)]
        for i, name in enumerate(names):  # one segment each: a long list wraps between names
            segs.append(
                ("  " if i == 0 else " ", Text(name + ("," if i < len(names) - 1 else ""), style="bold"))
            )
        segs.append(("  ", Text("(--expand lists them)", style="dim italic")))
        return _pack(segs, self.width - col)

    def node_label(self, node: Node, col: int) -> Text:
        if node.kind == GRAPH:
            name = Text(graph_title(node.graph, node.phase), style="bold magenta")
        else:
            name = Text(module_name(node.module), style="bold")
            mtype = self.ctree.types.get(node.module) if node.module is not None else None
            name.append(f" {safe_text(mtype)}" if mtype else "", style="dim")
        segs: list[tuple[str, Text]] = [("", name)]
        if node.kind in ("call", GRAPH):
            what = "call" if node.kind == "call" else "run"
            segs.append(("  ", Text(f"{what} #{node.first_seq}–#{node.last_seq}", style="dim")))
            if self.times:
                segs.append(("  ", Text(fmt_ns(node.duration_ns), style="dim")))
        if is_internal_error(node.error):
            segs.append(("  ", Text(f"stopped by PyTorch: {short_error(node.error or '')}", style="yellow")))
        elif node.error is not None:
            segs.append(("  ", Text(f"raised {short_error(node.error)}", style="red")))
        return _pack(segs, self.width - col)

    def add_children(self, branch: Tree, node: Node, level: int, col: int) -> None:
        """Add `node`'s children to `branch`; `level` is the call depth they sit at (1 = outermost),
        `col` the column their labels start at."""
        parent = node.module if node.kind in ("call", "group") else None
        children = node.children
        hidden: list[Node] = []
        for item, same in ct.runs(children, self.expand):
            if type(item) is not Node:
                if hidden:
                    branch.add(self.hidden_line(hidden, col))
                    hidden = []
                if type(item) is SavedTensors:
                    branch.add(self.saved_line(item, col))
                else:
                    branch.add(self.hook_line(item, parent, col))
                continue
            if self.depth is not None and level > self.depth:
                hidden += [item, *same]
                continue
            if hidden:
                branch.add(self.hidden_line(hidden, col))
                hidden = []
            sub = branch.add(self.node_label(item, col))
            self.add_children(sub, item, level + 1, col + GUIDE)
            if same:
                branch.add(self.collapsed_line(same, col))
        if hidden:
            branch.add(self.hidden_line(hidden, col))

    def hidden_line(self, nodes: list[Node], col: int) -> Text:
        hooks = sum(x.hooks for x in nodes)
        calls = sum(x.calls for x in nodes)
        what = plural(calls, "call") if calls else plural(len(nodes), "group")
        segs = [
            ("", Text(f"… {what} deeper than depth {self.depth}")),
            (" ", Text(f"({plural(hooks, 'hook call')})")),
        ]
        text = _pack(segs, self.width - col)
        text.stylize("dim italic")
        return text

    def collapsed_line(self, nodes: list[Node], col: int) -> Text:
        first, last = nodes[0], nodes[-1]
        names = [module_name(first.module)]
        if last.module != first.module:
            names.append(module_name(last.module))
        segs = [
            ("", Text(f"×{len(nodes)} more with the same order", style="italic")),
            (" ", Text(f"({' … '.join(names)},", style="dim")),
            (" ", Text(f"#{first.first_seq}–#{last.last_seq},", style="dim")),
            (" ", Text(f"{plural(sum(x.hooks for x in nodes), 'hook call')})", style="dim")),
        ]
        return _pack(segs, self.width - col)

    def phase_label(self, phase: Node) -> Text:
        label = Text(safe_text(PHASE_TITLES.get(phase.phase, phase.phase)), style="bold underline")
        label.append(f"  {plural(phase.hooks, 'hook call')}", style="dim")
        return label

    def tree(self) -> Tree:
        root = Text("hooktrace", style="bold")
        if self.meta.target:
            root.append(f" {safe_text(self.meta.target)}")
        if self.meta.rank is not None:
            root.append(f" (rank {self.meta.rank} of {self.meta.world_size})", style="dim")
        out = Tree(root, guide_style="dim")
        steps = self.ctree.steps
        if len({e.step for e in self.ctree.events}) == 1:
            for phase in steps[0].children:
                self.add_children(out.add(self.phase_label(phase)), phase, self.top, 2 * GUIDE)  # type: ignore[arg-type]
            return out
        for step, same in ct.runs(steps, self.expand):
            label = Text(f"step {step.step}", style="bold")
            if self.times and step.step == 0 and first_call_traced(self.meta):
                label.append(f"  ({FIRST_CALL})", style="dim")
            branch = out.add(label)
            for phase in step.children:
                self.add_children(branch.add(self.phase_label(phase)), phase, self.top, 3 * GUIDE)
            if same:
                span = f"step {same[0].step}" + (f" … step {same[-1].step}" if len(same) > 1 else "")
                line = Text(f"×{len(same)} more step{'s' if len(same) > 1 else ''} with the same order",
                            style="italic")  # fmt: skip
                line.append(f" ({span})", style="dim")
                out.add(line)
        return out


class TreeView:
    """The tree, the surprises and a summary line; a rich renderable laid out for the width it is
    printed at (the terminal's, or `tree_text`'s)."""

    def __init__(self, trace: Trace, tree: CallTree, surprises: list[Any], hidden_info: int, *,
                 expand: bool, times: bool, depth: Optional[int], empty: Optional[str]) -> None:  # fmt: skip
        self.trace = trace
        self.calltree = tree
        self.surprises = surprises
        self.hidden_info = hidden_info
        self.expand = expand
        self.times = times
        self.depth = depth
        self.empty = empty
        self.module: Optional[str] = None  # --module's path: --depth counts from its calls

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from self.parts(options.max_width)

    def parts(self, width: int) -> Iterator[RenderableType]:
        if self.empty is not None:
            yield Text(self.empty, style="bold")
        elif not self.calltree.steps:
            calls = sum(1 for e in self.calltree.events if e.type == ENTER)
            ran = "none ran a hook"
            if any(s.rule == "compiled" for s in self.trace.surprises):  # not a kind
                ran = "compiled code ran hooks unseen: see the note below"
            yield Text(f"No hooks fired ({plural(calls, 'module call')} traced, {ran}).", style="bold")
        else:
            yield _Drawer(self.calltree, width=width, expand=self.expand, times=self.times,
                          depth=self.depth, top=0 if self.module is not None else 1).tree()  # fmt: skip
        if self.surprises:
            yield _surprise_panel(self.surprises, self.expand, self.hidden_info)
        elif self.hidden_info:
            yield Text(info_line(self.hidden_info), style="dim")
        if self.calltree.events:
            yield _summary(self, width)
        if self.trace.meta.dry_run:
            yield Text(DRY_RUN_NOTE, style="yellow")


def _summary(view: TreeView, width: int) -> Text:
    """The trace's counts (`analysis.counts`, the same words and numbers as every other output);
    with --module/--phase, then how much of it the view shows."""
    events = view.calltree.events
    whole = count(view.trace)
    parts = [whole.phrase(), plural(whole.modules, "module")]  # the phrase is one segment: never split
    if whole.steps > 1:
        parts.append(plural(whole.steps, "step"))
    if len(events) != len(view.trace.events):
        shown = count(view.trace, events)
        parts.append(
            f"shown: {plural(shown.hook_calls, 'hook call')}, {plural(shown.module_calls, 'module call')}"
        )
    n = len(view.surprises)
    parts.append(plural(n, "surprise") + (f" (+{view.hidden_info} info)" if view.hidden_info else ""))
    left_out = hidden_of(view.trace)
    if left_out is not None:
        parts.append(left_out.phrase())
    note: Optional[str] = None
    if view.times and events:
        total = max(e.start_ns + e.duration_ns for e in events) - min(e.start_ns for e in events)
        parts.append(f"{fmt_ns(total)} total")
        spread = _step_spread(events)
        if spread:  # times move with the machine's load: the spread over steps shows how much
            parts.append(spread)
        note = times_note(view.trace.meta)
        if note is not None and first_call_traced(view.trace.meta) and all(e.step for e in events):
            note = None  # the view shows no event of step 0
    segs = [("", Text(parts[0]))] + [(" ", Text(p)) for p in parts[1:]]
    for i in range(len(segs) - 1):
        segs[i][1].append(",")
    if note:  # word by word, so a narrow terminal wraps it between words
        segs += [(" ", Text(w)) for w in f"({note})".split(" ")]
    text = _pack(segs, width)
    text.stylize("bold")
    return text


def _step_spread(events: list[Event]) -> Optional[str]:
    """`steps 21.80ms–206.00ms (median 25.10ms)` when the view holds two steps or more."""
    bounds: dict[int, list[int]] = {}
    for e in events:
        b = bounds.setdefault(e.step, [e.start_ns, e.start_ns + e.duration_ns])
        b[0], b[1] = min(b[0], e.start_ns), max(b[1], e.start_ns + e.duration_ns)
    if len(bounds) < 2:
        return None
    took = sorted(b - a for a, b in bounds.values())
    return f"steps {fmt_ns(took[0])}–{fmt_ns(took[-1])} (median {fmt_ns(took[len(took) // 2])})"


_NUMBERED = re.compile(r"(?<=\.)\d+\b|\b\d+(?=\.[A-Za-z_])|(?<=#)\d+")


def _group_surprises(surprises: list[Any], expand: bool) -> list[tuple[Any, int]]:
    """(first surprise, how many more alike) per rule and message that differ only in numbered
    module paths (layers.0 / layers.1) or seqs, in order of first appearance."""
    if expand:
        return [(s, 0) for s in surprises]
    groups: dict[tuple[str, str], list[Any]] = {}
    for s in surprises:
        groups.setdefault((s.rule, _NUMBERED.sub("N", s.message)), [s, 0])[1] += 1
    return [(first, count - 1) for first, count in groups.values()]


def _surprise_panel(surprises: list[Any], expand: bool, hidden_info: int) -> Panel:
    body = Text()
    for i, (s, alike) in enumerate(_group_surprises(surprises, expand)):
        if i:
            body.append("\n")
        body.append(safe_text(s.rule), style="bold yellow")
        body.append(f": {safe_text(s.message)}")
        if s.events:
            shown = " ".join(f"#{q}" for q in s.events[:6])
            more = f" (+{len(s.events) - 6} more)" if len(s.events) > 6 else ""
            body.append(f"  [see {shown}{more}]", style="dim")
        if alike:
            body.append(f"\n  ×{alike} more like this for other numbered modules", style="italic")
    if hidden_info:
        body.append(f"\n{info_line(hidden_info)}", style="dim")
    return Panel(body, title=plural(len(surprises), "surprise"), title_align="left", border_style="yellow",
                 expand=True)  # fmt: skip


def resolve_module(trace: Trace, module: str) -> str:
    """The module path `module` names, by `--module`'s rule (options.module_path); RenderError with
    the closest paths when the trace has no such module."""
    try:
        return module_path(trace.module_paths(), module)
    except UsageError as exc:
        raise RenderError(safe_text(str(exc))) from None


def build_tree(
    trace: Trace,
    *,
    depth: Optional[int] = None,
    module: Optional[str] = None,
    phase: Optional[str] = None,
    expand: bool = False,
    times: bool = True,
    show_empty: bool = False,
    all_surprises: bool = False,
) -> TreeView:
    """The tree, the surprises panel and a one-line summary, as one rich renderable.

    depth: module calls nested deeper than this are summarised in one line (counted from the phase, or
    from `module`'s own calls, at depth 0, when it is given). module: only calls and
    hooks of this module path and its descendants, as `resolve_module` gives it ("" for the root).
    phase: only this phase.
    expand: do not collapse repeated identical siblings, list saved-tensor hooks one by one.
    times: show durations. show_empty: keep calls where no hook fired. all_surprises: list `info`
    surprises too (else they are counted in one line).
    """
    if phase is not None and phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; expected one of {', '.join(PHASES)}")
    if depth is not None and depth < 0:
        raise ValueError(f"depth must be 0 or more, got {depth}")
    with gc_paused():
        tree = ct.build(trace, module=module, phase=phase, expand=expand, show_empty=show_empty)
    filtered = phase is not None or module is not None
    shown, hidden = split_surprises(_relevant(trace, tree.events, filtered), all_surprises)
    empty = _empty_message(trace, module, phase) if not tree.events else None
    view = TreeView(trace, tree, shown, hidden, expand=expand, times=times, depth=depth, empty=empty)
    view.module = module
    return view


def _relevant(trace: Trace, kept: list[Event], filtered: bool) -> list[Any]:
    if not filtered:
        return list(trace.surprises)
    seqs = {e.seq for e in kept}
    hook_ids = {e.hook for e in kept if e.type == HOOK}
    return [s for s in trace.surprises
            if any(q in seqs for q in s.events) or (not s.events and any(h in hook_ids for h in s.hooks))]  # fmt: skip


def _empty_message(trace: Trace, module: Optional[str], phase: Optional[str]) -> str:
    if not trace.events:
        return f"No events in this trace: nothing ran under capture ({plural(count(trace).registered, 'hook')} registered)."
    what = []
    if module is not None:
        what.append(f"module {module_name(module)!r}")
    if phase is not None:
        what.append(f"phase {phase!r}")
    return f"No events for {' and '.join(what)} in this trace."


def tree_text(
    trace: Any,
    *,
    width: int = 100,
    color: bool = False,
    module: Optional[str] = None,
    hide_library: bool = False,
    hide_globs: tuple[str, ...] = (),
    **opts: Any,
) -> str:
    """The tree of a `Trace`, or of the `with hooktrace.trace(...) as t` session, as text: plain
    (color=False, as when piped) or with ANSI colours. Options as `hooktrace render`: depth, module,
    phase, expand, times, all_surprises; hide_library and hide_globs as `--hide-library` and
    `--hide GLOB` (`hooktrace.tree_text` is this function).

    Always the text, also inside a Jupyter kernel (rich would otherwise send it to the notebook)."""
    trace = hide(
        getattr(trace, "trace", trace), library=hide_library, globs=hide_globs
    )  # a session: its trace
    if module is not None and trace.events:  # `--module`'s rule, as `run` and `render` apply it
        module = resolve_module(trace, module)
    return view_text(build_tree(trace, module=module, **opts), width=width, color=color)


def view_text(view: TreeView, *, width: int = 100, color: bool = False) -> str:
    """A built tree as `tree_text` gives it."""
    out = io.StringIO()
    console = Console(
        file=out,
        width=width,
        color_system="truecolor" if color else None,
        force_terminal=color,
        force_jupyter=False,
        no_color=not color,
        highlight=False,
        emoji=False,
        markup=False,
        legacy_windows=False,
    )
    console.print(view)
    return out.getvalue()
