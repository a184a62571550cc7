"""Hostile names: no control sequence from a module path, hook name, target, surprise message, error
or tensor description reaches the terminal, and SVG/DOT stay well-formed whatever the characters."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from hooktrace.render import render, safe_text
from hooktrace.render.dot import dot_source, svg
from hooktrace.render.tree import tree_text
from hooktrace.schema import Surprise, Trace
from tests.test_renderers_all import Builder

HAS_DOT = shutil.which("dot") is not None

OSC52 = "\x1b]52;c;ZXZpbA==\x07"  # write the clipboard
OSC8 = "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\"  # a hidden link
CLEAR = "\x1b[2J\x1b[H"
TITLE = "\x1b]0;pwned\x07"
ODD = "\x0b\ufffe\x00\x7f\x9b\u202e\ud800"
XMLISH = "<b>&amp;\"q\" 'a' \\n\\"


def hostile() -> Trace:
    mod = f"enc{OSC52}.fc{ODD}"
    b = Builder((mod, f"Lin{CLEAR}ear"), ("plain", "Linear"))
    bad = b.hook("forward_pre", mod, f"pre{OSC8}{XMLISH}", prepend=True, prepend_source="registration")
    glob = b.hook("forward", None, f"glob{XMLISH}{TITLE}", scope="global")
    ten = b.hook("grad", mod, "g", scope="tensor", tensor=f"output of {mod}")
    b.hooks[0].defined_at = f"{CLEAR}model.py:3"
    b.enter("")
    b.enter(mod)
    b.fire(bad, mod, error=f"ValueError: {CLEAR}{XMLISH}")
    b.fire(glob, mod)
    b.exit(mod, error=f"ValueError: {TITLE}")
    b.exit("")
    b.fire(ten, mod, "backward")
    b.surprises.append(Surprise(f"rule{CLEAR}", f"message {OSC52} {OSC8} {ODD}", [bad], [2]))
    b.surprises.append(Surprise("never-fired", f"info {TITLE}", [glob], [], level="info")
                       if "level" in Surprise.__dataclass_fields__ else Surprise("never-fired", f"x {TITLE}", [glob], []))  # fmt: skip
    return b.trace(target=f"/abs/{TITLE}model.py:make")


def test_safe_text_shows_control_characters_visibly() -> None:
    assert safe_text("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert safe_text("\x00\x07\x0b\x7f\x9b") == "\\x00\\x07\\x0b\\x7f\\x9b"
    assert safe_text("\ufffe\ud800\u202e") == "\\ufffe\\ud800\\u202e"
    assert safe_text("layers.0 → Ünïcode ×3 <root>") == "layers.0 → Ünïcode ×3 <root>"
    assert safe_text(12) == "12"


def _no_raw_controls(text: str) -> None:
    bad = re.findall("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u202e\ufffe]", text)
    assert not bad, sorted(set(bad))


@pytest.mark.parametrize("opts", [{}, {"expand": True}, {"all_surprises": True}, {"times": False}])
def test_tree_puts_no_control_sequence_on_the_terminal(opts: dict) -> None:
    text = tree_text(hostile(), width=100, **opts)
    _no_raw_controls(text)
    assert "\\x1b]52;c;ZXZpbA==\\x07" in text and "\\x1b[2J" in text
    assert "pre\\x1b]8;;https://evil.example" in text


def test_colour_tree_has_only_rich_own_styles() -> None:
    text = tree_text(hostile(), width=100, color=True)
    assert "\x1b]" not in text and "\x1b[2J" not in text and "\x07" not in text and "\x00" not in text
    styles = re.findall(r"\x1b\[([0-9;]*)m", text)
    assert styles and len(re.findall("\x1b", text)) == len(styles), "every ESC starts a colour (SGR) code"


def test_chrome_json_escapes_everything() -> None:
    trace = hostile()
    out = render(trace, "chrome")
    assert isinstance(out, str)
    _no_raw_controls(out)
    names = {e["name"] for e in json.loads(out)["traceEvents"]}
    assert trace.hooks[0].name in names, "escaped as JSON escapes: the value is unchanged"


def test_dot_is_accepted_and_svg_is_well_formed_xml() -> None:
    trace = hostile()
    dot = dot_source(trace)
    _no_raw_controls(dot)
    assert "/abs/" not in dot, "no absolute path in the title"
    if not HAS_DOT:
        pytest.skip("Graphviz dot is not installed")
    done = subprocess.run(["dot", "-Tsvg"], input=dot.encode("utf-8"), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    root = ET.fromstring(svg(trace))
    texts = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    assert "\\x1b]52;c;ZXZpbA==\\x07" in texts
    assert "<b>&amp;" in texts  # shown literally, escaped by Graphviz in the XML


def test_duplicate_seqs_give_unique_dot_ids() -> None:
    trace = hostile()
    trace.events = [e._replace(seq=0) for e in trace.events]
    dot = dot_source(trace)
    ids = re.findall(r"^\s*(\w+) \[", dot, flags=re.M)
    assert len(ids) == len(set(ids))
    if HAS_DOT:
        ET.fromstring(svg(trace))


def test_hooks_listing_and_error_lines_escape_control_sequences(tmp_path) -> None:
    """`hooktrace hooks` and every `error:` line show names and paths with escapes visible."""
    import subprocess
    import sys
    from pathlib import Path

    target = tmp_path / "evil.py"
    target.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.add_module('a\\x1b]52;c;SGVsbG8=\\x07b', torch.nn.Linear(2, 2))\n"
        "        list(self.children())[0].register_forward_hook(lambda m, a, o: None)\n"
        "def make():\n"
        "    return M()\n"
    )
    script = str(Path(sys.executable).parent / "hooktrace")
    listing = subprocess.run([script, "hooks", str(target)], capture_output=True, text=True)
    missing = subprocess.run(
        [script, "run", str(tmp_path / "no\x1b[2Jhere.py")], capture_output=True, text=True
    )
    assert listing.returncode == 0 and missing.returncode == 2
    for out in (listing.stdout, listing.stderr, missing.stdout, missing.stderr):
        assert "\x1b" not in out and "\x07" not in out
    assert "a\\x1b]52;c;SGVsbG8=\\x07b" in listing.stdout
    assert "no\\x1b[2Jhere.py" in missing.stderr


# What reorders, breaks or hides text, one character at a time: bidi marks, embeddings, overrides
# and isolates; line/paragraph separators (C1 NEL too); invisible format characters; tag characters
# (hidden text past U+FFFF); a lone surrogate; ESC.
HIDDEN = {
    "ALM U+061C": "\u061c",
    "LRM U+200E": "\u200e",
    "RLM U+200F": "\u200f",
    "LRE U+202A": "\u202a",
    "RLO U+202E": "\u202e",
    "LRI U+2066": "\u2066",
    "PDI U+2069": "\u2069",
    "LINE SEPARATOR U+2028": "\u2028",
    "PARAGRAPH SEPARATOR U+2029": "\u2029",
    "NEL U+0085": "\x85",
    "ZERO WIDTH SPACE U+200B": "\u200b",
    "WORD JOINER U+2060": "\u2060",
    "MONGOLIAN VOWEL SEPARATOR U+180E": "\u180e",
    "BOM U+FEFF": "\ufeff",
    "INTERLINEAR ANCHOR U+FFF9": "\ufff9",
    "TAG LATIN A U+E0041": "\U000e0041",
    "lone surrogate U+D800": "\ud800",
    "ESC": "\x1b",
}


def _one_char_trace(ch: str) -> Trace:
    mod = f"enc{ch}.fc"
    b = Builder((mod, f"Lin{ch}ear"))
    pre = b.hook("forward_pre", mod, f"pre{ch}hook")
    b.enter("")
    b.enter(mod)
    b.fire(pre, mod, error=f"ValueError: bad{ch}value")
    b.exit(mod, error=f"ValueError: bad{ch}value")
    b.exit("")
    b.surprises.append(Surprise("hook-error", f"message{ch}here", [pre], [2]))
    return b.trace(target=f"mod{ch}el.py:make")


@pytest.mark.parametrize("ch", list(HIDDEN.values()), ids=list(HIDDEN))
def test_no_renderer_shows_a_hidden_or_reordering_character_raw(ch: str) -> None:
    from hooktrace.render.notebook import trace_html, tree_html

    trace = _one_char_trace(ch)
    shown = {
        "tree": tree_text(trace, width=120, all_surprises=True),
        "tree in colour": tree_text(trace, width=120, color=True, all_surprises=True),
        "notebook tree": tree_html(trace),
        "dot": dot_source(trace),
        "chrome": str(render(trace, "chrome")),
        "order": str(render(trace, "order")),
    }
    if HAS_DOT:
        shown["svg"] = svg(trace)
        shown["notebook"] = trace_html(trace)
    for where, text in shown.items():
        if not (ch == "\x1b" and where == "tree in colour"):  # there ESC starts rich's own colours
            assert ch not in text, where
    escape = safe_text(ch)
    assert escape != ch and f"pre{escape}hook" in shown["tree"]
    assert f"enc{escape}.fc" in shown["tree"]
    chrome_names = {e["name"] for e in json.loads(shown["chrome"])["traceEvents"]}
    assert f"pre{ch}hook" in chrome_names  # JSON escapes: the value itself is unchanged
    if HAS_DOT:
        root = ET.fromstring(shown["svg"])
        texts = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
        assert f"pre{escape}hook" in texts


def test_joiners_and_letters_are_not_escaped() -> None:
    """The nearest case: zero-width joiners (emoji, Indic scripts), RTL letters, accents stay."""
    for text in ("👩\u200d💻", "क्\u200dष", "نموذج", "Ünïcode", "שלום"):
        assert safe_text(text) == text
