"""What `hooktrace.diff`, `assert_order`, `--check`, `hooktrace diff` and the pytest plugin compare.

Each side is a `Trace`, a tracing session, a path (a saved trace or an order file, told apart by
their first bytes) or order text. Two traces are compared by `analysis.diff.diff_traces` as they
are. When either side is order text, both are compared as order files: the trace is read as its
order lines would read back (`render.order`), so the hooks that never fired and everything the lines
leave out (times, ids, paths, how a `prepend` was known) play no part. Then `.equal` holds exactly
when the two order files have the same lines, headers and blank lines aside. No torch here.
"""

from __future__ import annotations

import difflib
import errno
import os
import sys
from pathlib import Path
from typing import Any, Optional, Union

from .analysis.diff import TraceDiff, diff_traces
from .io import GZIP_MAGIC, inflate, read_bytes
from .options import UsageError
from .render.order import (
    OrderFormatError,
    format_version,
    is_order_text,
    order_lines,
    order_text,
    parse_order,
)
from .schema import Trace, TraceFormatError
from .validate import load


def safe_lines(message: str) -> str:
    """Text from names, paths and files, control characters (and lone surrogates) shown escaped."""
    from .render.safe import safe_text

    return "\n".join(safe_text(line) for line in message.split("\n"))


__all__ = [
    "OrderFormatError",
    "Side",
    "TraceFormatError",
    "assert_order",
    "compare",
    "failure_message",
    "read_side",
]

Comparable = Union[Trace, str, "os.PathLike[str]", Any]  # a session: anything with a `.trace`
_PATH_ENDINGS = (".txt", ".json", ".gz")


class Side:
    """One side of a comparison: its trace, and whether it came from order text."""

    def __init__(self, trace: Trace, from_text: bool, name: str, text: Optional[str] = None) -> None:
        self.trace, self.from_text, self.name, self.text = trace, from_text, name, text
        self._order: Optional[Trace] = trace if from_text else None

    def as_order(self) -> Trace:
        """The trace as its order file reads back."""
        if self._order is None:
            self._order = parse_order(order_text(self.trace))
        return self._order

    def lines(self) -> list[str]:
        return order_lines(self.as_order())

    def has_format_line(self) -> bool:
        """False for order text given without its `# hooktrace order 1` line."""
        first = next((x for x in (self.text or "").splitlines() if x.strip()), "")
        return self.text is None or format_version(first) is not None

    def shown(self, headers: bool) -> tuple[list[str], list[str]]:
        """The lines a diff shows (text as written, a trace as its order file, with the headers or
        not) and what each means: a hook line as `order_lines` writes it, a header with its spaces
        evened, so a hand-edited snapshot with other spacing matches."""
        if self.text is not None:
            text = self.text
        else:
            text = order_text(self.as_order()) if headers else "\n".join(self.lines())
        lines, written = text.splitlines(), iter(self.lines())
        return lines, [next(written) if _is_hook_line(x) else " ".join(x.split()) for x in lines]


def _is_hook_line(line: str) -> bool:
    """As `parse_order` tells them: not blank, not a `#` header."""
    return bool(line.strip()) and not line.strip().startswith("#")


def read_side(x: Comparable, name: str = "") -> Side:
    """`x` as a Side. A string is a path when it is one line and names a file or a folder, or ends in
    .txt, .json or .gz (any case; spaces allowed): then it must name a file (else FileNotFoundError,
    IsADirectoryError). Any other string is order text, which may leave out the format line.
    TraceFormatError or OrderFormatError when a file or text cannot be read."""
    if isinstance(x, Trace):
        return Side(x, False, name or "trace")
    trace = getattr(x, "trace", None)
    if isinstance(trace, Trace):
        return Side(trace, False, name or "trace")
    if isinstance(x, os.PathLike) or (isinstance(x, str) and _is_path(x)):
        path = Path(x)
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, "a folder, not a saved trace or an order file", str(path))
        return read_file(path)
    if isinstance(x, str):
        return Side(parse_order(x), True, name or "order text", x)
    raise TypeError(f"cannot compare a {type(x).__name__}: give a Trace, a session, a path or order text")


def _is_path(text: str) -> bool:
    if "\n" in text or not text.strip():
        return False
    try:
        if os.path.exists(text):
            return True
    except (OSError, ValueError):  # too long, NUL
        return False
    return text.strip().lower().endswith(_PATH_ENDINGS)


def read_file(path: Path) -> Side:
    """A saved trace (JSON, gzip) or an order file, by its first bytes. An order file must start with
    the format line of this version (`render.order.parse_order(as_file=True)`); an OrderFormatError
    starts with the path."""
    raw = _file_bytes(path)
    if not is_order_text(raw[:64]):
        return Side(load(path), False, str(path))
    try:
        text = raw.decode("utf-8-sig")  # an editor's byte-order mark is no difference
    except UnicodeDecodeError as exc:
        raise OrderFormatError(f"{path}: neither a saved trace nor an order file (not UTF-8 text)") from exc
    try:
        return Side(parse_order(text, as_file=True), True, str(path), text)
    except OrderFormatError as exc:
        raise OrderFormatError(f"{path}: {exc}") from None


def compare(expected: Comparable, observed: Comparable) -> TraceDiff:
    """How the hook order of `observed` differs from `expected` (see the module's docstring)."""
    return compare_sides(read_side(expected, "expected"), read_side(observed, "observed"))


def compare_sides(a: Side, b: Side) -> TraceDiff:
    if a.from_text or b.from_text:
        return diff_traces(a.as_order(), b.as_order())
    return diff_traces(a.trace, b.trace)


def failure_message(a: Side, b: Side, result: TraceDiff, context: int = 3) -> str:
    """What an order test says when it fails: `diff`'s summary, then the unified diff of the two order
    files (expected first). A side read from a file or text is shown as written, so the `@@` line
    numbers are the file's; a trace as its order file would be written (without the headers when the
    other side is text without them)."""
    headers = a.has_format_line() and b.has_format_line()
    (la, ka), (lb, kb) = a.shown(headers), b.shown(headers)
    return f"{result.summary()}\n\n" + "\n".join(_unified(la, ka, lb, kb, a.name, b.name, context))


def _unified(
    la: list[str], ka: list[str], lb: list[str], kb: list[str], na: str, nb: str, n: int
) -> list[str]:
    """`difflib.unified_diff` of the lines `la` and `lb`, matched by their meanings `ka` and `kb`."""
    out = [f"--- {na}", f"+++ {nb}"]
    for group in difflib.SequenceMatcher(None, ka, kb).get_grouped_opcodes(n):
        (_, a1, _, b1, _), (_, _, a2, _, b2) = group[0], group[-1]
        out.append(f"@@ -{_range(a1, a2)} +{_range(b1, b2)} @@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [" " + x for x in la[i1:i2]]
                continue
            out += ["-" + x for x in la[i1:i2]] + ["+" + x for x in lb[j1:j2]]
    return out


def _range(start: int, stop: int) -> str:
    """A hunk's range as `diff -u` writes it: first line (1-based) and count, the count left out when 1."""
    count = stop - start
    if count == 1:
        return str(start + 1)
    return f"{start if count == 0 else start + 1},{count}"


def assert_order(observed: Comparable, expected: Comparable) -> TraceDiff:
    """AssertionError with `failure_message` unless `observed` has the hook order of `expected`."""
    a, b = read_side(expected, "expected"), read_side(observed, "observed")
    result = compare_sides(a, b)
    if not result.equal:
        raise AssertionError(failure_message(a, b, result))
    return result


# -- what the commands read and print (--check, diff, render) -----------------------------------


def load_trace_file(path: Path) -> Trace:
    """A saved trace (`render`, `ranks`): UsageError for anything else."""
    if not path.exists():
        raise UsageError(f"trace file not found: {path}; write one with hooktrace run TARGET -o {path.name}")
    try:
        return load(path)
    except (TraceFormatError, OSError) as exc:
        if _is_order_file(path):
            raise UsageError(
                f"cannot read {path}: it is an order file; render and ranks take saved traces (.json, .json.gz; "
                "hooktrace run -o FILE.json writes one); compare order files with hooktrace diff"
            ) from exc
        raise _unreadable(path, exc) from exc


def _file_bytes(path: Path) -> Union[bytes, bytearray]:
    """A file's bytes, inflated when it is gzip (`-f order -o x.txt.gz` writes it compressed); a
    regular file of a bounded size only: never a FIFO or /dev/zero."""
    raw = read_bytes(path)
    return inflate(raw, str(path)) if raw[:2] == GZIP_MAGIC else raw


def _is_order_file(path: Path) -> bool:
    """Does `path` start with an order file's format line (plain or gzip)?"""
    try:
        head = bytes(_file_bytes(path)[:200])
    except (TraceFormatError, OSError):
        return False
    return format_version(head.decode("utf-8-sig", "replace").split("\n", 1)[0]) is not None


def _unreadable(path: Path, exc: Exception) -> UsageError:
    """A trace file that could not be read: why, and (for a bad trace) what to give instead."""
    if isinstance(exc, OSError):
        return UsageError(f"cannot read {path}: {exc.strerror or exc}")
    advice = "" if "hooktrace run -o" in str(exc) else "; give a trace written by hooktrace run -o FILE.json"
    return UsageError(f"cannot read {path}: {exc}{advice}")


def load_side_file(path: Path) -> Side:
    """A saved trace or an order file (`--check`, `diff`)."""
    if not path.exists():
        raise UsageError(
            f"file not found: {path}; write a trace with hooktrace run TARGET -o {path.stem}.json "
            f"or an order file with -o {path.stem}.txt"
        )
    try:
        return read_file(path)
    except OrderFormatError as exc:
        raise UsageError(f"cannot read {exc}; give a trace (.json) or an order file (-f order)") from exc
    except (TraceFormatError, OSError) as exc:
        raise _unreadable(path, exc) from exc


def print_comparison(
    expected: Side, observed: Side, *, check: bool, quiet: bool = False, stream: Any = None
) -> bool:
    """Print the ordering differences to `stream`; True when the orders are equal. `quiet`: nothing
    when equal.

    By default `diff` prints to stdout; `run --check` to stderr, as its stdout may hold a JSON trace
    (run and exec give the standard error the command started with, outputs.real_stderr)."""
    if stream is None:
        stream = sys.stderr if check else sys.stdout
    result = compare_sides(expected, observed)
    if result.equal:
        if not quiet:
            print(safe_lines(f"same hook order: {expected.name} and {observed.name}"), file=stream)
        return True
    print(safe_lines(result.summary()), file=stream)
    return False
