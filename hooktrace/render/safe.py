"""Text from user code and trace files, made safe to show: names are shown literally, but no control
character reaches a terminal, and nothing breaks an XML (SVG) or DOT document.

Module paths, hook `__qualname__`s, `meta.target`, surprise messages and error strings come from
user code or from a file anyone may have written. A raw ESC in one of them would let it clear the
screen (`\\x1b[2J`), set the window title, write the clipboard (OSC 52) or plant a link (OSC 8).
`safe_text` shows every such character as a visible escape (`\\x1b`), so the name stays readable
and nothing is hidden. Every terminal rendering (tree, `render`, the `hooks` listing, `error:`
lines) and every DOT/SVG label goes through it.
"""

from __future__ import annotations

import re

__all__ = ["UNSAFE_CHARS", "safe_text"]

# C0 controls (tab and newline included: they would break a one-line label), DEL, C1 controls (NEL
# included), lone surrogates (unencodable as UTF-8); what reorders, breaks or hides text: the bidi
# marks (ALM U+061C, LRM, RLM), embeddings, overrides and isolates, the line and paragraph
# separators U+2028/U+2029, the invisible format characters (zero-width space, word joiner and
# invisible operators, the Mongolian vowel separator, interlinear annotations, the BOM, tag
# characters that can smuggle hidden text); and the noncharacters U+FFFE/U+FFFF (not allowed in
# XML). The zero-width joiners U+200C/U+200D stay: emoji and several scripts need them.
UNSAFE_CHARS = (
    "\x00-\x1f\x7f-\x9f\ud800-\udfff\u061c\u180e\u200b\u200e\u200f\u2028-\u202e\u2060-\u2064"
    "\u2066-\u206f\ufeff\ufff9-\ufffb\ufffe\uffff\U000e0001\U000e0020-\U000e007f"
)
_UNSAFE = re.compile(f"[{UNSAFE_CHARS}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def safe_text(text: object) -> str:
    """`text` as a string with every control character shown as a visible escape (`\\x1b`).

    Printable text, including non-ASCII letters, is unchanged; the result is safe to print to a
    terminal and to put in XML or DOT (after their own quoting of `<>&"` and backslashes).
    """
    s = text if isinstance(text, str) else str(text)
    return _UNSAFE.sub(_escape, s)
