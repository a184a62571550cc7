"""Where a command's output goes: rendered to the terminal or written to a file, and the
diagnostic lines on stderr (the CLI's; `cli.py` parses and calls)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from .options import HIDING, VIEW_FLAGS, UsageError, module_path
from .schema import Trace

PIPE_WIDTH = 120


# The standard streams as they were when the command started (`started_streams`): a traced script,
# factory or hook may swap `sys.stdout` (`redirect_stdout`), close it, or leave it redirected; the
# command's own output still goes to the process's standard output and error.
_STARTED: list[tuple[Any, Optional[int], Any, Optional[int]]] = []


def _fd(stream: Any) -> Optional[int]:
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return None


@contextlib.contextmanager
def started_streams() -> Iterator[None]:
    """Inside: `real_stdout()` / `real_stderr()` are `sys.stdout` / `sys.stderr` as they are now."""
    _STARTED.append((sys.stdout, _fd(sys.stdout), sys.stderr, _fd(sys.stderr)))
    try:
        yield
    finally:
        _STARTED.pop()


def _usable(stream: Any, fd: Optional[int]) -> Any:
    """`stream`, or when the traced code closed it, a new writer on its file descriptor (Python's
    standard streams do not close theirs)."""
    if not getattr(stream, "closed", False):
        return stream
    if fd is None:
        return sys.__stderr__
    encoding, errors = getattr(stream, "encoding", None) or "utf-8", getattr(stream, "errors", None)
    return open(fd, "w", encoding=encoding, errors=errors or "strict", closefd=False)


def real_stdout() -> Any:
    """The standard output the command started with (else the current one)."""
    return _usable(_STARTED[-1][0], _STARTED[-1][1]) if _STARTED else sys.stdout


def real_stderr() -> Any:
    """The standard error the command started with (else the current one)."""
    return _usable(_STARTED[-1][2], _STARTED[-1][3]) if _STARTED else sys.stderr


# Paths given on the command line, made absolute when the command starts (`anchored`: a script,
# factory or hook that changes folder does not move them), and shown as given (`shown`).
_GIVEN: dict[str, str] = {}


def anchored(path: Optional[Path]) -> Optional[Path]:
    """`path` made absolute now; messages name it as given (`shown`)."""
    if path is None:
        return None
    absolute = Path(os.path.abspath(path))
    _GIVEN[str(absolute)] = str(path)
    return absolute


def shown(path: Any) -> str:
    """A path as the command line gave it (see `anchored`)."""
    return _GIVEN.get(str(path), str(path))


def stderr_line(message: str) -> None:
    """A diagnostic line; text from names, paths and files in it shows control characters escaped."""
    from .render.safe import safe_text

    print("\n".join(safe_text(line) for line in message.split("\n")), file=real_stderr(), flush=True)


# Standard output is written to its file descriptor until every byte is taken: Python's buffered
# writer takes a short count from the file without a word, so a file-size limit (`ulimit -f`) cut
# `-f json > out.json` short with exit 0. Written here, the limit raises.


class _Whole:
    """A text stream (sys.stdout) or its binary buffer, whose writes reach its file descriptor whole or
    raise; a stream without a descriptor (a test's capture) is written as it is."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: Any) -> int:
        stream = self._stream
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
            return stream.write(data)
        raw = (
            data
            if isinstance(data, bytes)
            else data.encode(stream.encoding or "utf-8", stream.errors or "strict")
        )
        stream.flush()
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view) :]
        return len(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _stdout_failed(exc: OSError) -> UsageError:
    """A write to standard output that failed (not a closed pipe: that is the reader leaving)."""
    import errno

    reason = exc.strerror or str(exc)
    if exc.errno == errno.EFBIG:
        reason += " (a file-size limit, see ulimit -f)"
    elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
        reason += "; free some space or write elsewhere with -o"
    return UsageError(f"cannot write to standard output: {reason}; what it received is cut short")


@contextlib.contextmanager
def _writing_stdout() -> Iterator[None]:
    """A failed write to standard output inside is a UsageError (a closed pipe stays what it is)."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise _stdout_failed(exc) from exc


def to_stdout(data: Any) -> None:
    """Text or bytes to standard output, whole or not at all quietly: a failed write is a UsageError."""
    with _writing_stdout():
        stdout = real_stdout()
        _Whole(stdout.buffer if isinstance(data, bytes) else stdout).write(data)


def console(**options: Any) -> Any:
    """A rich console; piped output gets 120 columns (unless COLUMNS says otherwise), not rich's 80,
    so hook lines stay whole for grep and scripts. Standard output is written whole or not quietly (`_Whole`)."""
    from rich.console import Console

    if "file" not in options and "stderr" not in options:
        options["file"] = _Whole(real_stdout())
    console = Console(soft_wrap=False, **options)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPE_WIDTH
    return console


def check_renderable(fmt: Optional[str], output: Optional[Path]) -> None:
    """Before anything runs: UsageError when the format cannot be told from `-o`'s extension, or
    needs a program that is not installed (svg: Graphviz's `dot`)."""
    import shutil

    from . import render as r

    try:
        chosen = r.format_for_path(str(output) if output else None, fmt)
    except r.RenderError as exc:
        raise UsageError(str(exc)) from exc
    if chosen == "svg" and shutil.which("dot") is None:
        from .render.dot import INSTALL_HINT

        raise UsageError(
            f"svg output needs Graphviz's `dot`, which is not on PATH; nothing was run. {INSTALL_HINT}"
        )


def kept_path(output: Optional[Path]) -> Path:
    """Where a run's trace is kept as JSON when its rendering failed: beside `-o` (`run.svg` ->
    `run.svg.trace.json`), else in the working folder; never over an existing file."""
    base = output if output is not None else Path("hooktrace-trace")
    for n in range(1000):
        path = base.with_name(f"{base.name}.trace{'' if n == 0 else f'.{n}'}.json")
        if not path.exists():
            return path
    raise UsageError(f"cannot keep the trace beside {base}: too many earlier trace files there")


def output(
    trace: Trace,
    fmt: Optional[str],
    output: Optional[Path],
    view: dict[str, Any],
    quiet: bool = False,
    keep: bool = False,
) -> None:
    """Render to the terminal (tree: rich, colour when it is a terminal) or write to `output`.

    Display options the chosen format does not take are named in a `note:` and not applied.
    `keep`: the trace comes from a run; when rendering fails it is saved as JSON (`kept_path`), and
    the error says where."""
    from . import render as r

    whole = trace

    if "module" in view:  # not a kind: an option, resolved here once; the tree takes the path
        view = dict(view, module=module_path(trace.module_paths(), view["module"]))
    data: Union[str, bytes, None]
    try:
        chosen = r.format_for_path(str(output) if output else None, fmt)
        takes = r.renderer(chosen).options
        if chosen != "json":  # the trace file keeps every hook; every other rendering hides them
            trace = hidden(trace, view)
            view = {k: v for k, v in view.items() if k not in HIDING}
        ignored = [VIEW_FLAGS[k] for k in view if k not in takes]
        if ignored:
            what = ", which holds the whole trace" if chosen == "json" else " (tree only)"
            stderr_line(f"note: {', '.join(ignored)} not applied to {chosen} output{what}")
        opts = {k: v for k, v in view.items() if k in takes}
        if chosen == "tree":  # built here: `tree_text` would apply `--module`'s rule a second time
            from .render.tree import build_tree, view_text

            tree = build_tree(trace, **opts)
            if output is None:
                with _writing_stdout():
                    console().print(tree)
                return
            data = view_text(tree)
        elif chosen == "json" and output is not None and output.name.lower().endswith(".gz"):
            data = None  # Trace.save compresses it
        else:
            data = r.render(trace, chosen, **opts)
    except r.RenderError as exc:
        if not keep:
            raise UsageError(str(exc)) from exc
        path = kept_path(output)
        write(whole, path, None)
        raise UsageError(
            f"{exc}; the run's trace is kept in {path}: draw it with hooktrace render {path} -o PATH"
        ) from exc
    if output is None:
        assert data is not None
        to_stdout(data if isinstance(data, bytes) or data.endswith("\n") else data + "\n")
        return
    write(trace, output, data)
    if not quiet:
        from .analysis.counts import count
        from .analysis.hiding import hidden_of

        dry = "; dry run on meta: shapes only, no values" if trace.meta.dry_run else ""
        left_out = hidden_of(trace)
        dry += f"; {left_out.phrase()}" if left_out is not None else ""
        if chosen == "json":  # -o shows no tree: say where it is (issue 35)
            after = f"; the tree: hooktrace render {shown(output)}"
        elif chosen == "tree":
            after = ""
        else:
            after = "; no tree printed with -o (save -o run.json, then hooktrace render it)"
        stderr_line(f"wrote {shown(output)} ({chosen}: {count(trace).phrase()}{dry}){after}")


def hidden(trace: Trace, view: dict[str, Any]) -> Trace:
    """The trace as `--hide-library` / `--hide GLOB` in `view` leave it (`analysis.hiding`)."""
    if not any(k in view for k in HIDING):
        return trace
    from .analysis.hiding import hide

    return hide(trace, library=bool(view.get("hide_library")), globs=view.get("hide", ()))


def write(trace: Trace, output: Path, data: Any) -> None:
    """Write atomically: a failed write leaves what was at `output` untouched."""
    from .io import write_error_words, write_output

    try:
        if data is None:
            trace.save(output)
        else:
            write_output(output, data)  # gzip-compressed when the name ends in .gz
    except OSError as exc:
        given = Path(shown(output))
        raise UsageError(f"cannot write {given}: {write_error_words(exc, given, absolute=False)}") from exc


def is_html(fmt: Optional[str], output: Optional[Path]) -> bool:
    """The html format asked for, by name or by the extension of `-o`."""
    if fmt is not None:
        return fmt == "html"
    return output is not None and output.suffix.lower() in (".html", ".htm")


def text_or_html(fmt: Optional[str], output: Optional[Path], command: str) -> bool:
    """For `diff` and `ranks`, which print text or write a page: whether the page is asked for.
    UsageError for another format, or for `-o` with a name that is not a page's."""
    if fmt is not None and fmt not in ("text", "html"):
        raise UsageError(f"unknown --format {fmt!r} for {command}; use text or html")
    html = is_html(fmt, output)
    if output is not None and not html:
        raise UsageError(
            f"{command} writes html only (-f html or -o {output.stem}.html); text goes to the terminal"
        )
    return html


def emit_page(page: str, output: Optional[Path], what: str) -> None:
    """A page made from several traces: to `output` (atomically), else to stdout."""
    if output is None:
        to_stdout(page)
        return
    from .io import write_atomic, write_error_words

    try:
        write_atomic(output, page)
    except OSError as exc:
        given = Path(shown(output))
        raise UsageError(f"cannot write {given}: {write_error_words(exc, given, absolute=False)}") from exc
    stderr_line(f"wrote {shown(output)} ({what})")


def rank_trace_path(out: str, rank: Union[int, str]) -> str:
    """Where rank `rank` writes its trace for `-o out`: the extension becomes `.rank{r}.json`.

    `run.json` -> `run.rank0.json` (rank `"*"`: the pattern of them all); another extension is replaced too (`run.svg` -> `run.rank0.json`:
    ranks always write traces); a final `.gz` keeps the compression (`run.json.gz` -> `run.rank0.json.gz`).
    """
    gz = out.lower().endswith(".gz") and len(os.path.basename(out)) > 3
    stem = out[:-3] if gz else out
    base, ext = os.path.splitext(stem)
    if ext and not ({os.sep, os.altsep} - {None}) & set(ext):
        stem = base
    return f"{stem}.rank{rank}.json" + (".gz" if gz else "")
