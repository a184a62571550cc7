"""Notebooks: a trace and the `with` target display as HTML (the tree, and the SVG when `dot` is
there); the tree as text also inside a kernel, where rich believes it is talking to Jupyter; and,
when ipykernel and nbclient are installed, all of it in a real Jupyter kernel."""

from __future__ import annotations

import ast
import builtins
import io
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

import hooktrace
from hooktrace.render import render
from hooktrace.render.notebook import register, session_html, trace_html
from tests.test_renderers_all import two_layer

HAS_DOT = shutil.which("dot") is not None
ROOT = Path(__file__).resolve().parent.parent


class ZMQInteractiveShell:
    """What rich looks for to decide it is inside a Jupyter kernel."""


@pytest.fixture
def fake_jupyter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builtins, "get_ipython", lambda: ZMQInteractiveShell(), raising=False)


def test_rich_would_lose_the_text_in_a_kernel(fake_jupyter: None) -> None:
    """The condition the next test guards against: a StringIO console inside a kernel prints nothing."""
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=80).print("hello")
    assert out.getvalue() == ""


def test_tree_text_inside_a_kernel_is_the_text(fake_jupyter: None) -> None:
    text = render(two_layer(), "tree")
    assert isinstance(text, str) and "early" in text and "[prepend]" in text
    assert hooktrace.tree_text(two_layer()) == text
    assert "early" in trace_html(two_layer())


def test_html_without_graphviz_is_the_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    html = trace_html(two_layer())
    assert "<pre" in html and "early" in html and "prepend" in html and "global_pre" in html
    assert "<svg" not in html and "Graphviz" in html
    assert "\x1b" not in html and "color:" in html, "colours as inline styles, no ANSI codes"


@pytest.mark.skipif(not HAS_DOT, reason="Graphviz dot is not installed")
def test_html_with_graphviz_has_the_tree_and_the_svg() -> None:
    html = trace_html(two_layer())
    assert "<pre" in html and html.index("<pre") < html.index("<svg")
    assert "<?xml" not in html and "</svg>" in html


def test_session_html_inside_and_after_the_block() -> None:
    class Pending:
        @property
        def trace(self) -> Any:
            raise RuntimeError("the trace is available after the `with hooktrace.trace(...)` block ends")

    class Done:
        trace = two_layer()

    assert "available after" in session_html(Pending())
    assert "early" in session_html(Done())


def test_register_uses_names_not_classes() -> None:
    calls: list[tuple[str, str]] = []

    class Formatter:
        def for_type_by_name(self, module: str, name: str, func: Any) -> None:
            calls.append((module, name))
            assert callable(func)

    class Shell:
        class display_formatter:  # noqa: N801 - IPython's attribute name
            formatters = {"text/html": Formatter()}

    register(Shell())
    assert calls == [("hooktrace.schema", "Trace"), ("hooktrace.capture.session", "TraceSession")]
    from hooktrace.capture.session import TraceSession  # the name registered is the real one
    from hooktrace.schema import Trace

    assert (Trace.__module__, TraceSession.__module__) == ("hooktrace.schema", "hooktrace.capture.session")


def test_the_data_model_imports_no_renderer() -> None:
    tree = ast.parse((ROOT / "hooktrace" / "schema.py").read_text(encoding="utf-8"))
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [n for n in names if any(p in n for p in ("render", "capture", "analysis", "cli"))]
    assert not hasattr(hooktrace.Trace, "_repr_html_") and not hasattr(hooktrace.Trace, "_repr_svg_")


NOTEBOOK = """
import torch, hooktrace
from hooktrace.render import render
model = torch.nn.Sequential(torch.nn.Linear(3, 3))
def nb_pre_hook(module, args):
    return None
with hooktrace.trace(model) as t:
    model[0].register_forward_pre_hook(nb_pre_hook, prepend=True)
    model(torch.randn(2, 3)).sum().backward()
"""


def test_in_a_real_jupyter_kernel() -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    cells = [NOTEBOOK, "t", "t.trace", "print(hooktrace.tree_text(t))", "len(render(t.trace, 'tree'))"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(textwrap.dedent(c)) for c in cells])
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    ).execute()
    outputs = [cell.outputs for cell in nb.cells]
    for shown in outputs[1:3]:  # the `with` target and its trace
        html = shown[0]["data"]["text/html"]
        assert "nb_pre_hook" in html and "prepend" in html and "<pre" in html
        assert ("<svg" in html) == HAS_DOT
        assert html.index("<iframe") < html.index("<pre"), "the interactive report first"
    _report_in_the_iframe_works(outputs[2][0]["data"]["text/html"])
    printed = outputs[3][0]["text"]
    assert "nb_pre_hook" in printed and "\x1b" not in printed
    assert int(outputs[4][0]["data"]["text/plain"]) > 100


CELLS = [
    "import torch, hooktrace\nmodel = torch.nn.Sequential(torch.nn.Linear(3, 3))",
    "# a hook defined in this cell, on its line 2\ndef nb_hook(module, args):\n    return None",
    "with hooktrace.trace(model) as t:\n    model[0].register_forward_pre_hook(nb_hook)\n"
    "    model(torch.randn(2, 3)).sum().backward()",
    "print(hooktrace.tree_text(t))",
    "print(repr(t))",
    "print(t.trace.hooks[0].defined_at, t.trace.hooks[0].registered_at, sep='|')",
    "t",
]


def test_a_real_kernel_names_cells_and_sums_the_session_up() -> None:
    """Hooks defined in a cell show the cell as its prompt says it (`In [2], line 2`), not ipykernel's
    `/tmp/ipykernel_…/….py:2`; the session's plain repr is the counts line of every rendering."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    ).execute()
    defined, registered = (nb.cells[1].execution_count, nb.cells[2].execution_count)
    assert defined != registered
    tree = nb.cells[3].outputs[0]["text"]
    assert f"In [{defined}], line 2" in tree and "nb_hook" in tree
    assert "ipykernel_" not in tree
    summary = nb.cells[4].outputs[0]["text"].strip()
    assert "\n" not in summary and "TraceSession at 0x" not in summary
    assert (
        summary == "<hooktrace session: 1 hook registered, 1 fired, 1 hook call, 2 module calls, 0 surprises>"
    )
    assert nb.cells[5].outputs[0]["text"].strip() == f"In [{defined}]:2|In [{registered}]:2"
    shown = nb.cells[6].outputs[0]["data"]
    assert f"In [{defined}], line 2" in shown["text/html"] and shown["text/plain"] == summary


def test_notebook_cell_names_only_what_ipython_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from hooktrace.capture.sites import display_path, notebook_cell

    class Compiler:
        def format_code_name(self, name: str) -> Any:
            return ("Cell", "In[7]") if name == "/tmp/ipykernel_1/123.py" else None

    shell = types.SimpleNamespace(compile=Compiler())
    fake = types.ModuleType("IPython")
    fake.get_ipython = lambda: shell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", fake)
    assert notebook_cell("/tmp/ipykernel_1/123.py") == "In [7]"
    assert display_path("/tmp/ipykernel_1/123.py") == "In [7]"
    assert notebook_cell("/tmp/ipykernel_1/456.py") is None  # a file IPython did not compile
    assert display_path("/tmp/x/456.py") == "/tmp/x/456.py"
    fake.get_ipython = lambda: None  # type: ignore[attr-defined]  # IPython imported, no shell running
    assert notebook_cell("/tmp/ipykernel_1/123.py") is None


def test_cell_locations_read_as_ipython_says_them() -> None:
    from hooktrace.render.badges import location, site
    from hooktrace.schema import Meta

    assert site("In [3]:2") == "In [3], line 2"
    assert location("In [3]:2", Meta(target="t.py:make")) == "In [3], line 2"
    assert site("model.py:2") == "model.py:2" and site("In [3].py:2") == "In [3].py:2"


def _report_in_the_iframe_works(cell_html: str) -> None:
    """The notebook cell's HTML, opened in headless Chromium: the report inside the iframe is built
    and shows the hook (skipped without a browser)."""
    from tests import browser

    if browser.missing():
        return
    import tempfile

    from selenium.webdriver.support.ui import WebDriverWait

    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "cell.html"
        page.write_text(f"<!DOCTYPE html><html><body>{cell_html}</body></html>", encoding="utf-8")
        for driver in browser.chromium():
            driver.get(page.as_uri())
            driver.switch_to.frame(driver.find_element("css selector", "iframe.hooktrace-report"))
            WebDriverWait(driver, 30).until(lambda d: d.find_elements("css selector", ".tree .row"))
            rows = driver.execute_script(
                "return Array.from(document.querySelectorAll('.tree .row')).map(r => r.textContent)"
            )
            assert any("nb_pre_hook" in r and "prepend" in r for r in rows)
            errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
            assert errors == []


def test_report_iframe_is_escaped_and_sandboxed() -> None:
    from hooktrace.render.notebook import report_iframe

    frame = report_iframe(two_layer())
    assert frame is not None and frame.startswith("<iframe") and 'sandbox="allow-scripts"' in frame
    srcdoc = frame.split('srcdoc="', 1)[1].split('"', 1)[0]
    assert "<" not in srcdoc and "&lt;!DOCTYPE html&gt;" in srcdoc, "the page as an attribute value"


def test_report_iframe_is_left_out_for_huge_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    from hooktrace.render import notebook

    monkeypatch.setattr(notebook, "REPORT_MAX_EVENTS", 5)
    html = trace_html(two_layer())
    assert "<iframe" not in html and "too many" in html and "<pre" in html
