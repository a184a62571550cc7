"""The notebook display: a trace (or the `with hooktrace.trace(...) as t` session) shown as HTML.

The interactive HTML report (render/html.py) comes first, in a sandboxed iframe; then the tree, as
HTML with its colours (rich's own export, no Graphviz needed), folded in a `<details>` when the
report is there (the report shows once; the text is for viewers that strip iframes); then the SVG graph when Graphviz's `dot` is installed. `register(ip)` tells IPython to use this for
`Trace` and `TraceSession` objects by their dotted names, so nothing here imports torch and the data
model never imports a renderer: `hooktrace/__init__.py` calls it when IPython is already running.
"""

from __future__ import annotations

import html
import io
import shutil
from typing import Any, Optional

from ..schema import Trace

__all__ = ["register", "report_iframe", "session_html", "trace_html"]

WIDTH = 120  # columns of the HTML tree: notebooks are wider than terminals
REPORT_HEIGHT = 560  # pixels of the report's iframe
REPORT_MAX_EVENTS = 200_000  # larger traces: the tree only (the report would hold them all in the cell)
PRE_STYLE = "font-family:Menlo,'DejaVu Sans Mono',consolas,monospace;line-height:1.25;font-size:12px"


def tree_html(trace: Trace, *, width: int = WIDTH, **options: Any) -> str:
    """The tree as a `<pre>` of coloured spans (styles inline, so it survives notebook sanitizers)."""
    from rich.console import Console

    from .tree import build_tree

    console = Console(
        file=io.StringIO(),
        record=True,
        width=width,
        color_system="truecolor",
        force_terminal=True,
        force_jupyter=False,  # inside a kernel rich would send it to the notebook, not to the record
        highlight=False,
        emoji=False,
        markup=False,
        legacy_windows=False,
    )
    console.print(build_tree(trace, **options))
    return console.export_html(inline_styles=True, code_format=f'<pre style="{PRE_STYLE}">{{code}}</pre>')


def svg_html(trace: Trace) -> Optional[str]:
    """The SVG graph, or None when Graphviz's `dot` is not installed (or fails)."""
    if shutil.which("dot") is None:
        return None
    from .dot import svg
    from .errors import RenderError

    try:
        text = svg(trace)
    except RenderError:
        return None
    start = text.find("<svg")  # drop the XML declaration and doctype: the SVG goes inside HTML
    return text[start:] if start >= 0 else None


def report_iframe(trace: Trace, height: int = REPORT_HEIGHT) -> Optional[str]:
    """The interactive HTML report (render.html) in a sandboxed `<iframe srcdoc>`: scripts run in an
    opaque origin, apart from the notebook's page. None for traces too big to hold in a notebook
    cell (the report's data is the whole trace: write it with `-o report.html` instead)."""
    if len(trace.events) > REPORT_MAX_EVENTS:
        return None
    from .html import html_report

    page = html.escape(html_report(trace), quote=True)
    return (
        f'<iframe class="hooktrace-report" sandbox="allow-scripts" srcdoc="{page}" '
        f'style="width:100%;height:{height}px;border:1px solid #ddd;border-radius:4px"></iframe>'
    )


def trace_html(trace: Trace) -> str:
    """The whole display: the interactive report (iframe), the tree as text-styled HTML (what shows
    where iframes are stripped, as on GitHub), then the SVG graph when `dot` is there."""
    parts = ['<div class="hooktrace">']
    report = report_iframe(trace)
    if report is not None:
        parts.append(report)
    else:
        parts.append(
            f'<p style="font-size:11px;color:#777">{len(trace.events):,} events: too many for the '
            "interactive report in a notebook; write it with <code>render(trace, 'html')</code> "
            "to a file instead.</p>"
        )
    if report is not None:  # the report once: the text tree folded, for viewers that strip iframes
        parts.append(f"<details><summary>the tree as text</summary>{tree_html(trace)}</details>")
    else:
        parts.append(tree_html(trace))
    graph = svg_html(trace)
    if graph is not None:
        parts.append(f"<details><summary>graph (Graphviz)</summary>{graph}</details>")
    else:
        parts.append(
            '<p style="font-size:11px;color:#777">Install Graphviz (<code>dot</code>) to see the graph too.</p>'
        )
    parts.append("</div>")
    return "\n".join(parts)


def session_html(session: Any) -> str:
    """The `with` target: its trace once the block has ended, else a note saying so."""
    try:
        trace = session.trace
    except RuntimeError as exc:  # still inside the block
        return f"<p><b>hooktrace</b>: {html.escape(str(exc))}</p>"
    return trace_html(trace)


def register(ip: Any) -> None:
    """Show `Trace` and `TraceSession` objects as HTML in IPython shell `ip` (looked up by name:
    neither class, nor torch, is imported here)."""
    formatter = ip.display_formatter.formatters["text/html"]
    formatter.for_type_by_name("hooktrace.schema", "Trace", trace_html)
    formatter.for_type_by_name("hooktrace.capture.session", "TraceSession", session_html)
