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

__all__ = ["safe_text"]

# C0 controls (tab and newline included: they would break a one-line label), DEL, C1 controls,
# lone surrogates (unencodable as UTF-8), bidirectional overrides and isolates (they reorder what
# follows, hiding text), the BOM/zero-width no-break space, and the noncharacters U+FFFE/U+FFFF
# (not allowed in XML).
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\ud800-\udfff\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff\ufffe\uffff]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe_text(text: object) -> str:
    """`text` as a string with every control character shown as a visible escape (`\\x1b`).

    Printable text, including non-ASCII letters, is unchanged; the result is safe to print to a
    terminal and to put in XML or DOT (after their own quoting of `<>&"` and backslashes).
    """
    s = text if isinstance(text, str) else str(text)
    return _UNSAFE.sub(_escape, s)
