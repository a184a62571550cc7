"""The code layout (CONTRIBUTING.md, "Code layout"): floors of modules, imports only point down, no circles,
files small enough to read.

Every import of a hooktrace module is counted, at the top of a file or inside a function: an
import inside a function is still an arrow.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hooktrace"

# Bottom to top. A module may import from its own room (package or file) and from lower floors only;
# rooms on one floor know nothing of each other (the capture imports no analysis, and the reverse).
FLOORS: list[tuple[str, ...]] = [
    (
        "kinds",
        "io",
        "ids",
        "supported",
    ),  # the table of kinds and names; bytes; hook ids; torch versions: no hooktrace imports
    ("schema", "options"),  # the data model; run and view options declared once
    ("validate", "target", "inputs"),  # load-time checks: a document becomes a Trace; the factory, its inputs
    ("analysis", "capture"),  # pure functions of a Trace | the only code that touches torch's hooks
    ("render",),  # renderers
    ("compare", "outputs"),  # traces and order files side by side; where a command's output goes
    ("runs",),  # drivers over one capture, their one result and outcome
    ("ranks",),  # one run per rank
    ("hooktrace",),  # the public API (hooktrace/__init__.py)
    ("cli", "pytest_plugin"),  # the commands; the `hook_order` fixture
    ("__main__",),
]
FLOOR = {room: n for n, rooms in enumerate(FLOORS) for room in rooms}
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def room(module: str) -> str:
    """The room of a module: its sub-package, or the top-level file (`hooktrace` for the package)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imports() -> dict[str, set[str]]:
    """module -> the hooktrace modules it imports (relative imports resolved)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    out: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                # `from . import x` may name a module; else the names come from `stem`
                targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            out[name].update(t for t in targets if t == "hooktrace" or t.startswith("hooktrace."))
        out[name].discard(name)
    return out


def test_every_room_has_a_floor() -> None:
    rooms = {room(m) for m in imports()} | {room(module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert not sorted(rooms - set(FLOOR)), (
        "add the new module or package to FLOORS (and CONTRIBUTING.md's Code layout)"
    )


def test_no_arrow_runs_up_or_sideways() -> None:
    wrong = []
    for source, targets in imports().items():
        for target in targets:
            a, b = room(source), room(target)
            if a != b and FLOOR[b] >= FLOOR[a]:
                wrong.append(f"{source} -> {target} (floor {FLOOR[a]} -> {FLOOR[b]})")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_capture_imports_no_analysis_and_the_data_model_nothing_above_it() -> None:
    graph = imports()
    assert not [t for s, ts in graph.items() if room(s) == "capture" for t in ts if room(t) == "analysis"]
    assert {room(t) for t in graph["hooktrace.schema"]} <= {"io", "kinds"}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected sets of two or more modules (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    members.append(m)
                    if m == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return found


def test_no_import_circle() -> None:
    assert not circles(imports())


def test_the_circle_finder_and_the_import_reader_work() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    graph = imports()  # relative imports resolved, imports inside functions counted
    assert "hooktrace.runs.driver" in graph["hooktrace"]  # inside trace()
    assert "hooktrace.capture.session" in graph["hooktrace.capture"]
    assert "hooktrace.schema" in graph["hooktrace.analysis.calls"]


def test_files_are_small_enough_to_read() -> None:
    """A file past the limit has a second responsibility to move out, not lines to squeeze."""
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    long = {p: n for p, n in sizes.items() if n > MAX_LINES}
    assert not long, long
