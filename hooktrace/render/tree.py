"""The rich tree: hooktrace's default output, a pure function of a `Trace`.

phase -> (step, when there are several) -> module calls nested as they happened, each hook on one
line with its seq, kind, name, badges and where it is defined; then the surprises and a summary.

Forward, recompute and other phases nest by `enter`/`exit` events. Backward has no module calls,
so its hooks are grouped by module: a run of hooks of one module is one group, nested under the
group of an ancestor module when that one is still open (a module's `backward_pre` opens it, its
`backward` closes it). Every reading of the tree top to bottom is in `seq` order.

Consecutive sibling calls of identical shape (12 transformer layers) show once, then one line
"×11 more with the same order". Everything is linear in the number of events.
"""

from __future__ import annotations

import io
import operator
import re
from collections import Counter
from typing import Any, Optional, Union

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.text import Text
from rich.tree import Tree

from ..schema import PHASES, ROOT, Event, Hook, Trace, gc_paused

PHASE_TITLES = {
    "forward": "forward",
    "backward": "backward",
    "recompute": "recompute (forward again during backward)",
    "other": "other",
}
KIND_STYLES = {
    "forward_pre": "cyan",
    "forward": "green",
    "backward_pre": "magenta",
    "backward": "blue",
    "backward_legacy": "red",
    "grad": "yellow",
    "post_accumulate_grad": "yellow",
}
BADGE_STYLES = {
    "prepend": "bold yellow",
    "global": "bold cyan",
    "kwargs": "blue",
    "always": "blue",
    "returned": "magenta",
    "error": "bold red",
}
KIND_WIDTH = 13


def _contains(outer: Optional[str], inner: Optional[str]) -> bool:
    """`inner` is the module path `outer` or one of its descendants ("" is the root)."""
    if outer is None or inner is None:
        return False
    return outer == "" or inner == outer or inner.startswith(outer + ".")


def _rel(child: Optional[str], parent: Optional[str]) -> Optional[str]:
    """Path of `child` relative to `parent`, so layers.0.fc and layers.1.fc compare equal."""
    if child is None or parent is None or child == parent:
        return "" if child == parent else child
    if parent == "":
        return child
    if child.startswith(parent + "."):
        return child[len(parent) + 1 :]
    return child


def _fmt_ns(ns: int) -> str:
    if ns < 1_000:
        return f"{ns}ns"
    if ns < 1_000_000:
        return f"{ns / 1_000:.1f}µs"
    if ns < 1_000_000_000:
        return f"{ns / 1_000_000:.2f}ms"
    return f"{ns / 1_000_000_000:.2f}s"


class _Node:
    """A module call (`explicit`, from enter/exit) or a group of one module's hooks (backward)."""

    __slots__ = (
        "module",
        "explicit",
        "children",
        "first_seq",
        "last_seq",
        "start_ns",
        "duration_ns",
        "error",
        "sig",
        "hooks",
        "calls",
        "opened",
    )

    def __init__(
        self, module: Optional[str], explicit: bool, seq: int, start_ns: int = 0, duration_ns: int = 0
    ) -> None:
        self.module = module
        self.explicit = explicit
        self.children: list[Union[_Node, Event]] = []
        self.first_seq = seq
        self.last_seq = seq
        self.start_ns = start_ns
        self.duration_ns = duration_ns
        self.error: Optional[str] = None
        self.sig = 0
        self.hooks = 0  # hook events in the subtree, after pruning
        self.calls = 0  # module calls in the subtree, before pruning
        self.opened = False  # on a stack because of its enter, until its exit


class _Builder:
    """Nesting of one (phase, step): roots in event order and one stack of open nodes per thread.

    A node on a stack is either a call opened by its `enter` (closed by its `exit`) or a group of
    hooks (closed as soon as a hook of a module outside it fires).
    """

    __slots__ = ("roots", "stacks", "thread", "stack")

    def __init__(self) -> None:
        self.roots: list[_Node] = []
        self.stacks: dict[int, list[_Node]] = {}
        self.thread: Optional[int] = None
        self.stack: list[_Node] = []

    def _stack(self, thread: int) -> list[_Node]:
        if thread != self.thread:
            self.thread = thread
            self.stack = self.stacks.setdefault(thread, [])
        return self.stack

    def enter(self, e: Event) -> None:
        stack = self._stack(e.thread)
        module = e.module
        while stack and not stack[-1].opened and not _contains(stack[-1].module, module):
            stack.pop()
        if stack and not stack[-1].opened and not stack[-1].explicit and stack[-1].module == module:
            # hooks of this module were seen before its enter: that group is this call
            node = stack[-1]
            node.explicit = node.opened = True
            node.start_ns, node.duration_ns = e.start_ns, e.duration_ns
            return
        node = _Node(module, True, e.seq, e.start_ns, e.duration_ns)
        node.opened = True
        (stack[-1].children if stack else self.roots).append(node)
        stack.append(node)

    def exit(self, e: Event) -> None:
        stack = self._stack(e.thread)
        for i in range(len(stack) - 1, -1, -1):
            node = stack[i]
            if node.opened and node.module == e.module:
                del stack[i:]
                node.opened = False
                node.last_seq = e.seq
                node.error = e.error
                if not node.duration_ns:
                    node.duration_ns = max(0, e.start_ns - node.start_ns)
                return
        if e.error is not None:  # an exit without its enter still shows its exception
            node = _Node(e.module, True, e.seq)
            node.error = e.error
            (stack[-1].children if stack else self.roots).append(node)

    def hook(self, e: Event, module: Optional[str]) -> None:
        stack = self._stack(e.thread)
        if stack and stack[-1].module == module:
            stack[-1].children.append(e)
            return
        if module is None:  # a tensor hook that belongs to no module: into what is open
            if stack:
                stack[-1].children.append(e)
            elif self.roots and self.roots[-1].module is None:
                self.roots[-1].children.append(e)
            else:
                node = _Node(None, False, e.seq)
                node.children.append(e)
                self.roots.append(node)
            return
        while stack and not stack[-1].opened and not _contains(stack[-1].module, module):
            stack.pop()
        if stack and stack[-1].module == module:
            stack[-1].children.append(e)
            return
        siblings = stack[-1].children if stack else self.roots
        last = siblings[-1] if siblings else None
        if type(last) is _Node and last.module == module:
            node = last  # appending to the last sibling keeps the reading order
        else:
            node = _Node(module, False, e.seq)
            siblings.append(node)
        node.children.append(e)
        stack.append(node)


class _Context:
    """Per-call state of one rendering: lookups, interned shapes, options. Never kept between calls."""

    def __init__(self, trace: Trace, *, expand: bool, times: bool, show_empty: bool, depth: Optional[int]):
        self.trace = trace
        self.expand = expand
        self.times = times
        self.show_empty = show_empty
        self.depth = depth
        self.types = {m.path: m.type for m in trace.modules}
        self.hooks: dict[int, Optional[Hook]] = {}
        self.shapes: dict[Any, int] = {}
        self.hook_shapes: dict[Any, int] = {}

    def hook_of(self, hook_id: Optional[int]) -> Optional[Hook]:
        if hook_id is None:
            return None
        try:
            return self.hooks[hook_id]
        except KeyError:
            try:
                found: Optional[Hook] = self.trace.hook(hook_id)
            except KeyError:
                found = None
            self.hooks[hook_id] = found
            return found

    def module_of(self, e: Event) -> Optional[str]:
        if e.module is not None or e.type != "hook":
            return e.module
        hook = self.hook_of(e.hook)
        return hook.module if hook is not None else None

    def intern(self, key: Any) -> int:
        return self.shapes.setdefault(key, len(self.shapes) + 1)

    def hook_shape(self, e: Event, parent: Optional[str], key: Any) -> int:
        """Shape id of one hook event under `parent`: what it is, not which layer it belongs to."""
        rel = _rel(self.module_of(e), parent)
        h = self.hook_of(e.hook)
        what = (h.name, h.defined_at, h.scope, h.prepend, h.with_kwargs, h.always_call) if h else (e.hook,)
        shape = self.intern(("h", e.kind, what, e.returned, e.error is None, rel))
        self.hook_shapes[key] = shape
        return shape

    def finish(self, roots: list[_Node]) -> list[_Node]:
        """Counts, shape ids and pruning of hookless calls, children before parents; no recursion."""
        order: list[_Node] = []
        todo = list(roots)
        while todo:
            node = todo.pop()
            order.append(node)
            todo.extend(c for c in node.children if type(c) is _Node)
        hook_shapes = self.hook_shapes
        show_empty = self.show_empty
        for node in reversed(order):
            children = node.children
            here = node.module
            hooks = 0
            calls = 1 if node.explicit else 0
            pruned = False
            parts: list[Any] = []
            for c in children:
                if type(c) is _Node:
                    calls += c.calls
                    if not c.hooks and c.error is None and not show_empty:
                        pruned = True
                        continue
                    hooks += c.hooks
                    parts.append((_rel(c.module, here), c.sig))
                else:
                    hooks += 1
                    # the common case (a plain hook of this very module) keyed by its id alone
                    if c.module == here and not c.returned and c.error is None:
                        key: Any = c.hook
                    else:
                        key = (c.hook, c.kind, c.returned, c.error is None, c.module == here or c.module)
                    shape = hook_shapes.get(key)
                    parts.append(shape if shape is not None else self.hook_shape(c, here, key))
            if children:
                last = children[-1]
                node.last_seq = max(node.last_seq, last.last_seq if type(last) is _Node else last.seq)
            if pruned:
                node.children = [
                    c for c in children if type(c) is not _Node or c.hooks or c.error is not None
                ]
            node.hooks = hooks
            node.calls = calls
            node.sig = self.intern(
                ("c", node.explicit, self.types.get(node.module or ""), node.error is None, tuple(parts))
            )
        return [r for r in roots if self.show_empty or r.hooks or r.error is not None]

    # -- labels ------------------------------------------------------------------------------
    def hook_line(self, e: Event, parent: Optional[str]) -> Text:
        h = self.hook_of(e.hook)
        line = Text()
        line.append(f"#{e.seq} ", style="dim")
        kind = e.kind or (h.kind if h else "hook")
        line.append(kind.ljust(KIND_WIDTH), style=KIND_STYLES.get(kind, "white"))
        line.append(" ")
        line.append(h.name if h else f"<unknown hook {e.hook}>", style="bold")
        if h is not None and h.scope == "tensor" and h.tensor:
            line.append(f" on {h.tensor}")
        module = e.module
        if module is not None and module != parent:
            line.append(f" for {module or ROOT}")
        for badge in _badges(h, e):
            line.append(" ")
            line.append(f"[{badge}]", style=BADGE_STYLES.get(badge.split()[0], ""))
        if self.times:
            line.append(f"  {_fmt_ns(e.duration_ns)}", style="dim")
        if h is not None and h.defined_at:
            line.append(f"  {h.defined_at}", style="dim")
        if e.error is not None:
            line.append(f"  error: {_short_error(e.error)}", style="red")
        return line

    def node_label(self, node: _Node) -> Text:
        line = Text()
        if node.module is None:
            line.append("tensor hooks", style="italic")
            return line
        line.append(node.module or ROOT, style="bold")
        mtype = self.types.get(node.module)
        if mtype:
            line.append(f" {mtype}", style="dim")
        if node.explicit:
            line.append(f"  call #{node.first_seq}–#{node.last_seq}", style="dim")
            if self.times:
                line.append(f"  {_fmt_ns(node.duration_ns)}", style="dim")
        if node.error is not None:
            line.append(f"  raised {_short_error(node.error)}", style="red")
        return line

    # -- tree --------------------------------------------------------------------------------
    def add_children(self, branch: Tree, children: list[Any], parent: Optional[str], level: int) -> None:
        """Add `children` to `branch`; `level` is the call depth they sit at (1 = outermost)."""
        i, n = 0, len(children)
        while i < n:
            c = children[i]
            if type(c) is not _Node:
                branch.add(self.hook_line(c, parent))
                i += 1
                continue
            j = i + 1
            if self.depth is not None and level > self.depth:
                while j < n and type(children[j]) is _Node:
                    j += 1
                branch.add(self.hidden_line(children[i:j]))
                i = j
                continue
            if not self.expand:
                while j < n and type(children[j]) is _Node and children[j].sig == c.sig:
                    j += 1
            sub = branch.add(self.node_label(c))
            self.add_children(sub, c.children, c.module, level + 1)
            if j - i > 1:
                branch.add(self.collapsed_line(children[i + 1 : j]))
            i = j

    def hidden_line(self, nodes: list[_Node]) -> Text:
        hooks = sum(x.hooks for x in nodes)
        calls = sum(x.calls for x in nodes)
        groups = len(nodes)
        what = (
            f"{calls} call{'s' if calls != 1 else ''}"
            if calls
            else f"{groups} group{'s' if groups != 1 else ''}"
        )
        return Text(f"… {what} deeper than depth {self.depth} ({hooks} hook events)", style="dim italic")

    def collapsed_line(self, nodes: list[_Node]) -> Text:
        first, last = nodes[0], nodes[-1]
        names = (
            [_label_name(first)] if first.module == last.module else [_label_name(first), _label_name(last)]
        )
        hooks = sum(x.hooks for x in nodes)
        line = Text(f"×{len(nodes)} more with the same order", style="italic")
        span = " … ".join(names)
        line.append(f" ({span}, #{first.first_seq}–#{last.last_seq}, {hooks} hook events)", style="dim")
        return line


def _short_error(error: str) -> str:
    """`"ExceptionType: "` (no message) reads as just the type."""
    return error.rstrip().rstrip(":")


def _label_name(node: _Node) -> str:
    if node.module is None:
        return "tensor hooks"
    return node.module or ROOT


def _badges(h: Optional[Hook], e: Event) -> list[str]:
    out: list[str] = []
    if h is not None:
        if h.prepend:
            out.append("prepend" if h.prepend_source != "inferred" else "prepend inferred")
        if h.scope == "global":
            out.append("global")
        if h.with_kwargs:
            out.append("kwargs")
        if h.always_call:
            out.append("always")
    if e.returned:
        out.append("returned")
    if e.error is not None:
        out.append("error")
    return out


def _ordered(events: list[Event]) -> list[Event]:
    seqs = [e[0] for e in events]
    if all(map(operator.lt, seqs, seqs[1:])):
        return events
    return sorted(events, key=operator.itemgetter(0))


def _summary(events: list[Event], ctx: _Context, n_steps: int, n_surprises: int, *, times: bool) -> Text:
    types = Counter(map(operator.attrgetter("type"), events))
    hook_events, calls = types["hook"], types["enter"]
    hook_ids = set(map(operator.attrgetter("hook"), events)) - {None}
    modules = set(map(operator.attrgetter("module"), events)) - {None}
    parts = [
        f"{len(hook_ids)} hook{'s' if len(hook_ids) != 1 else ''} fired ({hook_events} hook events)",
        f"{calls} module call{'s' if calls != 1 else ''}",
        f"{len(modules)} module{'s' if len(modules) != 1 else ''}",
    ]
    if n_steps > 1:
        parts.append(f"{n_steps} steps")
    parts.append(f"{n_surprises} surprise{'s' if n_surprises != 1 else ''}")
    if times and events:
        starts = list(map(operator.attrgetter("start_ns"), events))
        ends = map(operator.add, starts, map(operator.attrgetter("duration_ns"), events))
        parts.append(f"{_fmt_ns(max(ends) - min(starts))} total")
    return Text(", ".join(parts), style="bold")


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


def _surprise_panel(surprises: list[Any], expand: bool) -> Panel:
    body = Text()
    for i, (s, alike) in enumerate(_group_surprises(surprises, expand)):
        if i:
            body.append("\n")
        body.append(s.rule, style="bold yellow")
        body.append(f": {s.message}")
        if s.events:
            shown = " ".join(f"#{q}" for q in s.events[:6])
            more = f" (+{len(s.events) - 6} more)" if len(s.events) > 6 else ""
            body.append(f"  [see {shown}{more}]", style="dim")
        if alike:
            body.append(f"\n  ×{alike} more like this for other numbered modules", style="italic")
    title = f"{len(surprises)} surprise{'s' if len(surprises) != 1 else ''}"
    return Panel(body, title=title, title_align="left", border_style="yellow", expand=True)


def build_tree(
    trace: Trace,
    *,
    depth: Optional[int] = None,
    module: Optional[str] = None,
    phase: Optional[str] = None,
    expand: bool = False,
    times: bool = True,
    show_empty: bool = False,
) -> Group:
    """The tree, the surprises panel and a one-line summary, as one rich renderable.

    depth: module calls nested deeper than this are summarised in one line. module: only calls and
    hooks of this module path and its descendants. phase: only this phase. expand: do not collapse
    repeated identical siblings. times: show durations. show_empty: keep calls where no hook fired.
    """
    if phase is not None and phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; expected one of {', '.join(PHASES)}")
    if depth is not None and depth < 0:
        raise ValueError(f"depth must be 0 or more, got {depth}")
    ctx = _Context(trace, expand=expand, times=times, show_empty=show_empty, depth=depth)
    with gc_paused():
        return _build(trace, ctx, module, phase)


def _build(trace: Trace, ctx: _Context, module: Optional[str], phase: Optional[str]) -> Group:
    builders: dict[tuple[str, int], _Builder] = {}
    kept: list[Event] = []
    b_key: Any = None
    b = _Builder()
    for e in _ordered(trace.events):
        if phase is not None and e.phase != phase:
            continue
        mod = e.module if e.module is not None else ctx.module_of(e)
        if module is not None and not _contains(module, mod):
            continue
        kept.append(e)
        if b_key != (e.phase, e.step):
            b_key = (e.phase, e.step)
            b = builders.setdefault(b_key, _Builder())
        if e.type == "enter":
            b.enter(e)
        elif e.type == "exit":
            b.exit(e)
        else:
            b.hook(e, mod)

    surprises = _relevant_surprises(trace, kept, filtered=phase is not None or module is not None)
    steps = sorted({e.step for e in kept})
    summary = _summary(kept, ctx, len(steps), len(surprises), times=ctx.times)
    parts: list[RenderableType] = []
    if not kept:
        parts.append(Text(_empty_message(trace, module, phase), style="bold"))
    else:
        tree = _tree(trace, ctx, builders, steps)
        if tree is None:
            calls = sum(1 for e in kept if e.type == "enter")
            parts.append(
                Text(f"No hooks fired ({calls} module calls traced, none ran a hook).", style="bold")
            )
        else:
            parts.append(tree)
    if surprises:
        parts.append(_surprise_panel(surprises, ctx.expand))
    if kept:
        parts.append(summary)
    return Group(*parts)


def _tree(trace: Trace, ctx: _Context, builders: dict[tuple[str, int], _Builder], steps: list[int]) -> Any:
    root_label = Text("hooktrace", style="bold")
    if trace.meta.target:
        root_label.append(f" {trace.meta.target}")
    if trace.meta.rank is not None:
        root_label.append(f" (rank {trace.meta.rank} of {trace.meta.world_size})", style="dim")
    tree = Tree(root_label, guide_style="dim")
    shown = False
    for ph in PHASES:
        per_step = [(s, ctx.finish(builders[(ph, s)].roots)) for s in steps if (ph, s) in builders]
        per_step = [(s, roots) for s, roots in per_step if roots]
        if not per_step:
            continue
        shown = True
        hooks = sum(r.hooks for _, roots in per_step for r in roots)
        label = Text(PHASE_TITLES[ph], style="bold underline")
        label.append(f"  {hooks} hook event{'s' if hooks != 1 else ''}", style="dim")
        branch = tree.add(label)
        if len(steps) == 1:
            ctx.add_children(branch, per_step[0][1], None, 1)
            continue
        shapes = [ctx.intern(("s", tuple((r.module, r.sig) for r in roots))) for _, roots in per_step]
        i = 0
        while i < len(per_step):
            j = i + 1
            while not ctx.expand and j < len(per_step) and shapes[j] == shapes[i]:
                j += 1
            step, roots = per_step[i]
            sub = branch.add(Text(f"step {step}", style="bold"))
            ctx.add_children(sub, roots, None, 1)
            if j - i > 1:
                rest = per_step[i + 1 : j]
                span = f"step {rest[0][0]}" + (f" … step {rest[-1][0]}" if len(rest) > 1 else "")
                line = Text(f"×{len(rest)} more steps with the same order", style="italic")
                line.append(f" ({span})", style="dim")
                branch.add(line)
            i = j
    return tree if shown else None


def _relevant_surprises(trace: Trace, kept: list[Event], *, filtered: bool) -> list[Any]:
    if not filtered:
        return list(trace.surprises)
    seqs = {e.seq for e in kept}
    hook_ids = {e.hook for e in kept if e.type == "hook"}
    return [
        s
        for s in trace.surprises
        if any(q in seqs for q in s.events) or (not s.events and any(h in hook_ids for h in s.hooks))
    ]


def _empty_message(trace: Trace, module: Optional[str], phase: Optional[str]) -> str:
    if not trace.events:
        n = len(trace.hooks)
        return f"No events in this trace: nothing ran under capture ({n} hook{'s' if n != 1 else ''} known)."
    what = []
    if module is not None:
        what.append(f"module {module!r}")
    if phase is not None:
        what.append(f"phase {phase!r}")
    hint = ""
    if module is not None and not any(_contains(module, m.path) for m in trace.modules):
        known = ", ".join(repr(m.path) for m in trace.modules[:6])
        hint = f"; no such module (modules: {known}{', …' if len(trace.modules) > 6 else ''})"
    return f"No events for {' and '.join(what)} in this trace{hint}."


def tree_text(trace: Trace, *, width: int = 100, color: bool = False, **opts: Any) -> str:
    """The tree as text: plain (color=False, as when piped) or with ANSI colours."""
    out = io.StringIO()
    console = Console(
        file=out,
        width=width,
        color_system="truecolor" if color else None,
        force_terminal=color,
        no_color=not color,
        highlight=False,
        emoji=False,
        markup=False,
        legacy_windows=False,
    )
    console.print(build_tree(trace, **opts))
    return out.getvalue()
