"""The call tree of a trace: events -> steps -> phases -> nested module calls and hook groups.

A pure function of a `Trace` (like pyinstrument's processors or viztracer's `functree`): the tree,
DOT/SVG and notebook renderers all draw this one structure, so they cannot disagree on nesting.

- Steps hold their phases in order of first appearance (forward, backward, optimizer, ...).
- Forward, recompute and other phases nest by `enter`/`exit` events, one stack per thread.
- Backward has no module calls, so a run of one module's hooks is a `group`, nested under an
  ancestor's group while that one is open. A module's `backward` hook closes its group: when the
  module was called twice, its second `backward_pre` (or `backward`) opens a second group.
- Hooks that belong to no module (optimizer hooks, tensor hooks on plain tensors, node hooks whose
  node is not known) go into what is open on their thread, else straight into their phase; never
  into a backward group whose module's `backward` hook already fired (that module's backward is
  over: the hook ran after it, for something else).
- Every container gets a signature: equal when two containers ran the same hooks in the same
  order, whatever their numbered path (`layers.0` / `layers.1`), so renderers collapse runs of
  identical siblings (`runs`). Calls where no hook fired are pruned unless `show_empty`.
- Saved-tensor `pack`/`unpack` events directly inside one container (two or more) are summarised
  as one `SavedTensors` leaf (they can fire hundreds of times per step), unless `expand`.

Everything is linear in the number of events, and no recursion (deep models are fine).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Iterator, Optional, Union

from ..kinds import (
    BACKWARD,
    BACKWARD_CALL_KINDS,
    CLOSING_KINDS,
    ENTER,
    EXIT,
    GRAPH,
    HOOK,
    RECOMPUTE,
    SAVED_TENSORS_KINDS,
    K,
)
from ..schema import Event, Hook, Trace
from .calls import Call, in_order, pair
from .paths import _parent_path, _relative_tensor, contains, relative

__all__ = [
    "CallTree",
    "Node",
    "SavedTensors",
    "build",
    "contains",
    "hook_lookup",
    "module_of",
    "relative",
    "runs",
]

SAVED_KINDS = SAVED_TENSORS_KINDS  # pack, then unpack


class SavedTensors:
    """pack/unpack events directly inside one container, shown as one summary line or node."""

    __slots__ = ("events", "sig")

    def __init__(self, events: list[Event]) -> None:
        self.events = events
        self.sig = 0

    @property
    def seq(self) -> int:
        return self.events[0].seq

    @property
    def last_seq(self) -> int:
        return self.events[-1].seq

    def counts(self) -> dict[str, int]:
        """Events per kind, `pack` first."""
        c = Counter(e.kind for e in self.events)
        return {k: c[k] for k in SAVED_KINDS if c[k]}


Leaf = Union[Event, SavedTensors]


class Node:
    """A container: `step`, `phase`, a module `call` (from enter/exit), a `group` of one module's
    hooks (backward, or hooks seen outside any call of their module), or a `graph`: one run of a
    compiled graph, holding the hooks it ran in program order."""

    __slots__ = (
        "kind",
        "module",
        "step",
        "phase",
        "first_seq",
        "last_seq",
        "start_ns",
        "duration_ns",
        "error",
        "children",
        "sig",
        "hooks",
        "calls",
        "opened",
        "closing",
        "graph",
    )

    def __init__(self, kind: str, e: Event, module: Optional[str] = None) -> None:
        self.kind = kind
        self.module = module
        self.step = e.step
        self.phase = e.phase
        self.first_seq = e.seq
        self.last_seq = e.seq
        self.start_ns = e.start_ns
        self.duration_ns = e.duration_ns if kind == "call" else 0
        self.error: Optional[str] = None
        self.children: list[Union[Node, Leaf]] = []
        self.sig = 0
        self.hooks = 0  # hook events below, after pruning
        self.calls = 0  # module calls below (itself included), before pruning
        self.opened = kind == "call"  # a call on its thread's stack until its exit
        self.closing = False  # a group whose module's `backward` hook fired
        self.graph: Optional[int] = None  # a `graph` node (a compiled graph's run): its number

    def __repr__(self) -> str:
        return f"<Node {self.kind} {self.module!r} step={self.step} {self.phase} #{self.first_seq}>"


class _PhaseBuilder:
    """Nesting of one (step, phase): one stack of open containers per thread."""

    __slots__ = ("root", "stacks", "graphs")

    def __init__(self, root: Node) -> None:
        self.root = root
        self.stacks: dict[int, list[Node]] = {}
        self.graphs: dict[tuple[int, int], Node] = {}  # (thread, graph number) -> its latest run

    def _close_groups(self, stack: list[Node], module: Optional[str]) -> None:
        while stack and not stack[-1].opened and not contains(stack[-1].module, module):
            stack.pop()

    def enter(self, e: Event) -> Node:
        stack = self.stacks.setdefault(e.thread, [])
        self._close_groups(stack, e.module)
        top = stack[-1] if stack else None
        if top is not None and top.kind == "group" and top.module == e.module and not top.closing:
            # hooks of this module were seen before its enter: that group is this call
            top.kind, top.opened = "call", True
            top.start_ns, top.duration_ns = e.start_ns, e.duration_ns
            return top
        node = Node("call", e, e.module)
        (top or self.root).children.append(node)
        stack.append(node)
        return node

    def close(self, node: Node, thread: int, e: Event, own: bool) -> None:
        """`e` ends the call `node` (its own exit when `own`, else an outer call's: see calls.py)."""
        stack = self.stacks.setdefault(thread, [])
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is node:
                del stack[i:]
                break
        node.opened = False
        if own:
            node.last_seq = e.seq
            node.error = e.error
            if not node.duration_ns:
                node.duration_ns = max(0, e.start_ns - node.start_ns)

    def unmatched_exit(self, e: Event) -> None:
        """An exit without its enter still shows its exception."""
        if e.error is not None:
            stack = self.stacks.setdefault(e.thread, [])
            node = Node("call", e, e.module)
            node.opened = False
            node.error = e.error
            (stack[-1] if stack else self.root).children.append(node)

    def hook(self, e: Event, module: Optional[str]) -> None:
        stack = self.stacks.setdefault(e.thread, [])
        if e.graph is not None and self._in_graph(e, stack):
            return
        if module is None:  # belongs to no module: into what is open on its thread, but never into a
            # backward group that its module's `backward` hook already ended (it is another's node)
            while stack and stack[-1].kind == "group" and stack[-1].closing:
                stack.pop()
            (stack[-1] if stack else self.root).children.append(e)
            return
        self._close_groups(stack, module)
        top = stack[-1] if stack else None
        if top is not None and top.closing and top.module == module and e.kind in BACKWARD_CALL_KINDS:
            stack.pop()  # the same module's next call in backward
            top = stack[-1] if stack else None
        if top is None or top.module != module:
            siblings = (top or self.root).children
            last = siblings[-1] if siblings else None
            if type(last) is Node and last.kind == "call" and last.module == module and e.kind == K.forward:
                last.children.append(e)  # a forward hook recorded after its call's exit
                return
            group = Node("group", e, module)
            if e.phase == BACKWARD:
                _adopt(siblings, group)
            siblings.append(group)
            stack.append(group)
            top = group
        top.children.append(e)
        if top.kind == "group" and e.kind in CLOSING_KINDS:
            top.closing = True

    def _in_graph(self, e: Event, stack: list[Node]) -> bool:
        """A graph's run is a container in what is open on its thread; the hooks it ran go into it."""
        if e.type == HOOK:
            run = self.graphs.get((e.thread, e.graph))  # type: ignore[arg-type]
            if run is not None:
                run.children.append(e)
            return run is not None
        run = self.graphs[(e.thread, e.graph)] = Node(GRAPH, e, e.module)  # type: ignore[index]
        run.duration_ns, run.error, run.graph = e.duration_ns, e.error, e.graph
        (stack[-1] if stack else self.root).children.append(run)
        return True


def _adopt(siblings: list[Any], group: Node) -> None:
    """In backward, closed groups of `group`'s descendants right before it ran inside its backward
    (a module's full backward hook fires after its submodules' backward): they move into it, so
    identical layers stay identical siblings (`layers.79` holding its `mlp`'s hooks, then `layers.78`
    holding its own) instead of alternating with their submodules' groups."""
    module = group.module
    n = len(siblings)
    while n and type(siblings[n - 1]) is Node:
        last: Node = siblings[n - 1]
        if last.kind != "group" or last.module == module or not contains(module, last.module):
            break
        n -= 1
    if n == len(siblings):
        return
    group.children[:0] = siblings[n:]
    group.first_seq, group.start_ns = siblings[n].first_seq, siblings[n].start_ns
    del siblings[n:]


class CallTree:
    """Steps (sorted), each a `Node("step")` holding its `Node("phase")`s in order of appearance."""

    def __init__(self, trace: Trace, steps: list[Node], events: list[Event]) -> None:
        self.trace = trace
        self.steps = steps
        self.events = events  # the events kept (after filters), in seq order
        self.types = {m.path: m.type for m in trace.modules}

    @property
    def hooks(self) -> int:
        return sum(s.hooks for s in self.steps)


def hook_lookup(trace: Trace) -> Callable[[Optional[int]], Optional[Hook]]:
    """`hook_of(id)`: the HOOK with that id, or None (unknown ids never raise)."""
    by_id: dict[int, Hook] = {}
    for h in trace.hooks:
        by_id.setdefault(h.id, h)
    return lambda hook_id: by_id.get(hook_id) if hook_id is not None else None


def module_of(e: Event, hook_of: Callable[[Optional[int]], Optional[Hook]]) -> Optional[str]:
    """The module an event belongs to: its own, else (hook events) its hook's module."""
    if e.module is not None or e.type != HOOK:
        return e.module
    h = hook_of(e.hook)
    return h.module if h is not None else None


def build(
    trace: Trace,
    *,
    module: Optional[str] = None,
    phase: Optional[str] = None,
    expand: bool = False,
    show_empty: bool = False,
) -> CallTree:
    """The call tree of `trace`. module: only events of this module path and its descendants.
    phase: only this phase. expand: list pack/unpack events one by one. show_empty: keep calls
    where no hook fired."""
    hook_of = hook_lookup(trace)
    events = in_order(trace.events)
    ends: dict[int, list[Call]] = {}  # exit seq -> the calls it ends, its own first
    for c in sorted(pair(events), key=lambda c: c.exit is None):
        if c.end is not None:
            ends.setdefault(c.end, []).append(c)
    opened: dict[int, tuple[_PhaseBuilder, Node]] = {}  # enter seq -> its call's node
    steps: dict[int, Node] = {}
    builders: dict[tuple[int, str], _PhaseBuilder] = {}
    kept: list[Event] = []
    key: Any = None
    b: Optional[_PhaseBuilder] = None
    for e in events:
        if e.type == EXIT:  # whatever the filters keep, the calls it ends are closed
            ending = ends.get(e.seq, ())
            for c in ending:
                found = opened.pop(c.enter, None)
                if found is not None:
                    found[0].close(found[1], c.thread, e, c.exit == e.seq)
        if phase is not None and e.phase != phase:
            continue
        mod = module_of(e, hook_of)
        if module is not None and not contains(module, mod):
            continue
        kept.append(e)
        if key != (e.step, e.phase):
            key = (e.step, e.phase)
            b = builders.get(key)
            if b is None:
                step = steps.get(e.step)
                if step is None:
                    step = steps[e.step] = Node("step", e)
                ph = Node("phase", e)
                step.children.append(ph)
                b = builders[key] = _PhaseBuilder(ph)
        assert b is not None
        if e.type == ENTER:
            opened[e.seq] = (b, b.enter(e))
        elif e.type == EXIT:
            if not ending or ending[0].exit != e.seq:
                b.unmatched_exit(e)
        else:
            b.hook(e, mod)
    shapes = _Shapes(trace, hook_of, expand=expand, show_empty=show_empty)
    ordered = [steps[s] for s in sorted(steps)]
    return CallTree(trace, [s for s in ordered if shapes.finish(s)], kept)


class _Shapes:
    """Signatures, counts and pruning, children before parents."""

    def __init__(self, trace: Trace, hook_of: Any, *, expand: bool, show_empty: bool) -> None:
        self.types = {m.path: m.type for m in trace.modules}
        self.hook_of = hook_of
        self.expand = expand
        self.show_empty = show_empty
        self.ids: dict[Any, int] = {}
        self.hook_sigs: dict[Any, int] = {}

    def intern(self, key: Any) -> int:
        return self.ids.setdefault(key, len(self.ids) + 1)

    def hook_sig(self, e: Event, parent: Optional[str]) -> int:
        """What a hook event is, not which numbered layer it belongs to."""
        key = (e.hook, e.kind, e.module, e.returned, e.error, parent)
        sig = self.hook_sigs.get(key)
        if sig is None:
            h = self.hook_of(e.hook)
            what = (
                (h.name, h.defined_at, h.scope, h.prepend, h.with_kwargs, h.always_call) if h else (e.hook,)
            )
            tensor = _relative_tensor(h.tensor, parent) if h is not None else None
            rel = relative(e.module, parent)
            sig = self.hook_sigs[key] = self.intern(("h", e.kind, what, tensor, rel, e.returned, e.error))
        return sig

    def finish(self, root: Node) -> bool:
        """Finish `root` and everything below; True when it is kept (a hook fired, or it raised)."""
        order: list[Node] = []
        todo = [root]
        while todo:
            node = todo.pop()
            order.append(node)
            todo.extend(c for c in node.children if type(c) is Node)
        for node in reversed(order):
            self._finish_one(node)
        return bool(root.hooks) or root.error is not None or (self.show_empty and root.calls > 0)

    def _finish_one(self, node: Node) -> None:
        here = node.module if node.kind in ("call", "group") else None
        if not self.expand:
            _summarise_saved(node)
        if node.kind == "phase" and node.phase == RECOMPUTE and not self.expand:
            for group in _by_checkpointed_module(node):
                self._finish_one(group)
        kept: list[Union[Node, Leaf]] = []
        parts: list[Any] = []
        hooks = 0
        calls = 1 if node.kind == "call" else 0
        for c in node.children:
            if isinstance(c, Node):
                calls += c.calls
                if not c.hooks and c.error is None and not self.show_empty:
                    continue
                hooks += c.hooks
                parts.append((relative(c.module, here), c.sig))
            elif isinstance(c, SavedTensors):
                hooks += len(c.events)
                c.sig = self.intern(("s", tuple(self.hook_sig(x, here) for x in _distinct(c.events)),
                                     tuple(c.counts().items())))  # fmt: skip
                parts.append(c.sig)
            else:
                hooks += 1
                parts.append(self.hook_sig(c, here))
            kept.append(c)
        if kept:
            last = kept[-1]
            node.last_seq = max(node.last_seq, last.seq if isinstance(last, Event) else last.last_seq)
        node.children = kept
        node.hooks = hooks
        node.calls = calls
        mtype = self.types.get(node.module) if node.module is not None else None
        phase = node.phase if node.kind == "phase" else None
        node.sig = self.intern((node.kind, phase, mtype, node.error, tuple(parts)))


def _by_checkpointed_module(phase: Node) -> list[Node]:
    """A recompute re-runs a checkpointed module's forward without calling the module itself, so its
    submodules' calls sit side by side in the phase (24 layers: 96 calls in a row). Consecutive calls
    of submodules of one module become one `group` of that module, so the groups of numbered layers
    compare equal and fold as the forward's layers do. Only where this makes two groups or more."""
    out: list[Union[Node, Leaf]] = []
    groups: list[Node] = []
    current: Optional[Node] = None
    for c in phase.children:
        parent = _parent_path(c.module) if type(c) is Node and c.kind == "call" else None
        if current is not None and (parent == current.module or (parent is None and type(c) is not Node)):
            current.children.append(c)
            current.last_seq = max(
                current.last_seq, c.last_seq if isinstance(c, (Node, SavedTensors)) else c.seq
            )
            continue
        if parent is None:
            current = None
            out.append(c)
            continue
        assert type(c) is Node
        current = Node.__new__(Node)
        for name in Node.__slots__:
            setattr(current, name, getattr(c, name))
        current.kind, current.module, current.children = "group", parent, [c]
        current.duration_ns, current.error, current.opened, current.closing = 0, None, False, False
        groups.append(current)
        out.append(current)
    if len(groups) < 2:
        return []
    phase.children = out
    return groups


def _distinct(events: list[Event]) -> list[Event]:
    seen: dict[Any, Event] = {}
    for e in events:
        seen.setdefault((e.hook, e.kind), e)
    return list(seen.values())


def _summarise_saved(node: Node) -> None:
    """pack/unpack leaves directly in `node` become one SavedTensors leaf where the first one was."""
    saved = [c for c in node.children if type(c) is Event and c.kind in SAVED_KINDS]
    if len(saved) < 2:  # one is shown as it is
        return
    summary = SavedTensors(saved)
    out: list[Union[Node, Leaf]] = []
    for c in node.children:
        if type(c) is Event and c.kind in SAVED_KINDS:
            if c is saved[0]:
                out.append(summary)
            continue
        out.append(c)
    node.children = out


def runs(children: list[Any], expand: bool = False) -> Iterator[tuple[Any, list[Node]]]:
    """(item, identical Nodes right after it) over `children`: a run of consecutive containers with
    the same signature is drawn once, the rest summarised ("×N more"), unless `expand`."""
    i, n = 0, len(children)
    while i < n:
        c = children[i]
        j = i + 1
        if type(c) is Node and not expand:
            while j < n and type(children[j]) is Node and children[j].sig == c.sig:
                j += 1
        yield c, children[i + 1 : j]
        i = j
