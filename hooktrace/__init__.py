"""hooktrace: see the order in which PyTorch hooks really fire, and why.

Public API (docs/contract.md)::

    import hooktrace
    with hooktrace.trace(model) as t:
        model(x).sum().backward()
    t.to_dict(); t.save("run.json"); hooktrace.load("run.json")
    hooktrace.diff("golden.txt", t).equal; hooktrace.assert_order(t, "golden.txt")

Importing this package does not import torch; `trace()` does.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Optional

from .inputs import Inputs, Target
from .schema import Trace, TraceFormatError
from .supported import UnsupportedTorch
from .validate import load

if TYPE_CHECKING:
    from .analysis.diff import TraceDiff
    from .capture import TraceSession

__all__ = [
    "trace",
    "load",
    "diff",
    "assert_order",
    "tree_text",
    "Trace",
    "TraceFormatError",
    "UnsupportedTorch",
    "Target",
    "Inputs",
]
__version__ = "0.1.0"


def trace(model: Optional[Any] = None, *, target: Optional[str] = None, shapes: bool = False) -> TraceSession:
    """Trace every hook that fires inside the `with` block.

    `model` names module paths and has its pre-existing hooks inventoried. It may be given later
    with `session.attach(model)` (the CLI calls the factory inside the capture). Without a model,
    every module called inside the block is traced: each outermost module call is a root, paths are
    `named_modules()` paths under it, prefixed by its class name (`Name#2` for a second root of the
    same class) when there are several roots. `shapes=True`: each hook event also records the
    shapes, dtypes and devices of what the hook received and returned (`Event.shapes`, e.g.
    `(f32[8,16] cpu,), f32[8,4] cpu`); off by default, and then it costs nothing.
    """
    from .analysis.counts import summary
    from .runs.driver import open_capture

    return open_capture(model, target=target, describe=summary, shapes=shapes)


def diff(a: Any, b: Any) -> TraceDiff:
    """How the hook order of `b` differs from `a` (the expected one). Each is a `Trace`, a session,
    a path (a saved trace or an order file) or order text. The result has `.equal`,
    `.differences` (moved, removed, added, ... hooks, each naming where) and a readable `str()`.

    A `str` is a path when it is one line and names an existing file or folder, or ends in `.txt`,
    `.json` or `.gz` (`.json.gz`, `.txt.gz`; any case, spaces allowed): then FileNotFoundError when
    it does not exist, IsADirectoryError for a folder. Any other `str` is order text, which may leave
    out the `# hooktrace order 1` first line that an order file must have. OrderFormatError for an
    order file or text of another format version, or not in the format."""
    from .compare import compare

    return compare(a, b)


def assert_order(observed: Any, expected: Any) -> None:
    """Raise AssertionError, with `diff`'s summary and the unified diff of the order lines, unless
    `observed` (a Trace, a session, a path or order text, told apart as `diff` does) has the hook
    order of `expected`."""
    from .compare import assert_order as check

    check(observed, expected)


def __getattr__(name: str) -> Any:
    """`hooktrace.tree_text` is `render.tree.tree_text`, imported (with rich) on first use."""
    if name == "tree_text":
        from .render.tree import tree_text

        return tree_text
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _register_notebook_display() -> None:
    """In IPython/Jupyter (already imported, so never imported here), show traces and sessions as
    HTML: the tree, and the graph when Graphviz is installed (`render/notebook.py`)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is None or not hasattr(shell, "display_formatter"):
        return
    from .render.notebook import register

    register(shell)


_register_notebook_display()


def __dir__() -> list[str]:
    """The public API and the module's dunders (PEP 562): not the typing names and modules it uses."""
    return sorted({*__all__, *(n for n in globals() if n.startswith("__") and n.endswith("__"))})
