"""Renderers: pure functions of a `Trace`, chosen by name from one registry.

Each renderer is described once (name, file extension, binary or not, the options it takes) and
imported only when used, so `hooktrace render -f json` never loads rich or graphviz. No torch here.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .errors import RenderError
from .safe import safe_text

if TYPE_CHECKING:
    from ..schema import Trace

__all__ = [
    "RENDERERS",
    "RenderError",
    "Renderer",
    "format_for_path",
    "render",
    "renderer",
    "safe_text",
]

# not a kind: the tree's options
TREE_OPTIONS = ("width", "color", "depth", "module", "phase", "expand", "times", "all_surprises")


@dataclass(frozen=True)
class Renderer:
    """One output format: where its function lives and what it produces."""

    name: str
    extension: str  # what `-o PATH` should end with; "" when the format is never taken from a path
    binary: bool  # True: `render` returns bytes, write them as they are
    description: str
    target: str  # "module:function", imported on first use
    options: tuple[str, ...] = ()

    def function(self) -> Callable[..., Union[str, bytes]]:
        module_name, _, func_name = self.target.partition(":")
        return getattr(importlib.import_module(module_name, __name__), func_name)


def _json_text(trace: Trace) -> str:
    """The trace format itself, byte for byte what `Trace.save` writes."""
    return trace.to_json().decode("utf-8")


RENDERERS: dict[str, Renderer] = {
    r.name: r
    for r in (
        Renderer("tree", ".txt", False, "rich tree of phases, module calls and hooks", ".tree:tree_text",
                 TREE_OPTIONS),
        Renderer("json", ".json", False, "the trace format (version 2), readable by hooktrace render/diff",
                 f"{__name__}:_json_text"),
        Renderer("dot", ".dot", False, "Graphviz DOT source: clusters per phase and module call",
                 ".dot:dot_source", ("expand",)),
        Renderer("svg", ".svg", False, "the DOT graph laid out by Graphviz's dot program",
                 ".dot:svg", ("expand",)),
        Renderer("chrome", ".json", False, "Chrome Trace Event JSON for Perfetto / chrome://tracing",
                 ".chrome:chrome_json"),
        Renderer("order", ".txt", False, "one line per hook call, for golden files and code review",
                 ".order:order_text"),
        Renderer("html", ".html", False, "one self-contained HTML page: tree, timeline, surprises, search",
                 ".html:html_report"),
    )
}  # fmt: skip

# `chrome` also writes .json, so only these extensions choose a format on their own (and .json.gz).
_BY_EXTENSION = {
    ".json": "json",
    ".dot": "dot",
    ".svg": "svg",
    ".txt": "order",
    ".html": "html",
    ".htm": "html",
}


def renderer(fmt: str) -> Renderer:
    """The registered renderer called `fmt`; RenderError naming the known ones otherwise."""
    try:
        return RENDERERS[fmt]
    except KeyError:
        raise RenderError(f"unknown format {fmt!r}; use one of {', '.join(RENDERERS)}") from None


def format_for_path(path: Optional[Union[str, os.PathLike[str]]], fmt: Optional[str]) -> str:
    """The format to write: `fmt` when given, else from the extension of `path`, else `tree`."""
    if fmt is not None:
        return renderer(fmt).name
    if path is None:
        return "tree"
    name = os.fspath(path).lower()
    if name.endswith(".gz"):  # `run.json.gz`, `run.svg.gz`: the format inside, written compressed
        name = name[:-3]
    ext = os.path.splitext(name)[1]
    try:
        return _BY_EXTENSION[ext]
    except KeyError:
        known = ", ".join(f"{e} ({f})" for e, f in _BY_EXTENSION.items())
        raise RenderError(
            f"cannot tell the format of {os.fspath(path)!r} from its extension ({known}); "
            f"pass --format {'|'.join(RENDERERS)}"
        ) from None


def render(trace: Trace, fmt: str, **options: Any) -> Union[str, bytes]:
    """Render `trace` as `fmt` (a name in RENDERERS) with that renderer's options."""
    r = renderer(fmt)
    unknown = sorted(set(options) - set(r.options))
    if unknown:
        takes = f"it takes {', '.join(r.options)}" if r.options else "it takes none"
        raise RenderError(f"the {r.name} renderer has no option {', '.join(unknown)}; {takes}")
    return r.function()(trace, **options)
