"""The one outcome of every command that drives a capture (`run`, `exec`, their `--nproc`, a rank
under torchrun): where the trace goes once it is complete (`show`), and what is said at the end and
the exit code (`finish`) (docs/contract.md, exit codes).

A trace that says its rank (exec under torchrun) is written to its rank's file, and only rank 0
shows it; `run --nproc` / `exec --nproc` show the ranks with `hooktrace.ranks.show` and end through
`finish` with the shown rank's trace.
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..compare import Side, print_comparison
from ..outputs import is_html, output, rank_trace_path, real_stderr, stderr_line, write
from .driver import LOADING

if TYPE_CHECKING:
    from ..schema import Trace
    from .driver import Result

EXIT_OK, EXIT_DIFFERENT = 0, 1


@dataclass(frozen=True)
class Shown:
    """How a command shows its trace: the format, `-o`, the view options, `-q`, `--traceback`, and of
    many ranks, the one shown (`--rank`)."""

    fmt: Optional[str] = None
    output: Optional[Path] = None
    view: dict[str, Any] = field(default_factory=dict)
    quiet: bool = False
    traceback: bool = False
    rank: int = 0


def differs(golden: Optional[Side], observed: Trace, name: str, quiet: bool) -> bool:
    """`--check GOLDEN`: whether `observed` differs from it (the differences printed); False without one."""
    if golden is None:
        return False
    # on the standard error the command started with, not one the script left (a closed one, a buffer)
    equal = print_comparison(
        golden, Side(observed, False, name), check=True, quiet=quiet, stream=real_stderr()
    )
    return not equal


def _notes(notes: list[str], golden: Optional[Side], quiet: bool) -> None:
    """A run's notes on stderr; none with `--check GOLDEN -q`, which prints only the differences."""
    if quiet and golden is not None:
        return
    for note in notes:
        stderr_line(f"note: {note}")


def _shown(result: Result, shown: Shown) -> bool:
    """Whether this trace is the one shown: one process's, or the shown rank's of many."""
    return result.trace.meta.rank in (None, shown.rank)


def show(result: Result, shown: Shown, golden: Optional[Side]) -> None:
    """The trace, as soon as it is complete: rendered or written to `-o`, then the run's notes."""
    trace, rank, out, fmt = result.trace, result.trace.meta.rank, shown.output, shown.fmt
    if result.stopped_in == LOADING:  # nothing ran: an earlier trace at `-o` stays as it was
        if out is not None and out.exists():
            stderr_line(f"note: {out} is left as it was")
    elif rank is None:
        if not (shown.quiet and out is None):
            output(trace, fmt, out, shown.view, shown.quiet, keep=True)
    else:  # under torchrun: every rank writes its file, only rank 0 shows the trace
        if out is not None:  # with -o nothing goes to stdout (it may be the script's own output)
            write(trace, Path(rank_trace_path(str(out), rank)), None)
        if rank == shown.rank and out is not None and is_html(fmt, out):  # a page needs every rank's file
            files = rank_trace_path(str(out), "*")
            stderr_line(
                f"note: each rank writes {files}; every rank in one page: hooktrace ranks {files} -o {out}"
            )
        elif rank == shown.rank and out is not None and not shown.quiet:
            stderr_line(
                f"wrote {rank_trace_path(str(out), '*')} (one trace per rank; rank {rank}'s tree: hooktrace render {rank_trace_path(str(out), rank)})"
            )
        elif rank == shown.rank:
            output(trace, fmt, None, shown.view)
    if _shown(result, shown):
        _notes(result.notes, golden, shown.quiet)


def finish(result: Result, shown: Shown, golden: Optional[Side]) -> int:
    """After the trace was shown: how the program ended (`sys.exit`'s text, its failure, the signal
    that stopped it) and the `--check` comparison, on stderr; the exit code: the program's own, at
    least 1 when the trace differs from GOLDEN, 128 + the signal when one stopped it."""
    from .uncaught import report_uncaught

    if result.forked:  # a child the script forked (a DataLoader worker, ...): it ends as untraced
        if result.exit_message is not None:
            print(result.exit_message, file=sys.stderr)
        if result.exception is not None:
            report_uncaught(result.exception)
        return int(result.exit_code)
    code = result.exit_code
    if result.exit_message is not None:
        stderr_line(result.exit_message)
    exc = result.exception
    if exc is not None:
        if result.traceback is not None:  # a script's: as python reports it (its sys.excepthook)
            report_uncaught(exc)
        elif shown.traceback:
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=real_stderr())
        stderr_line(f"run failed: {result.error}")
    if _shown(result, shown) and differs(golden, result.trace, result.label, shown.quiet):
        code = max(code, EXIT_DIFFERENT)
    if result.stopped_by is not None:
        if _shown(result, shown):
            name = result.stopped_by.name
            if result.stopped_in == LOADING:
                stderr_line(f"stopped by {name} while {LOADING}: nothing was traced")
            else:
                stderr_line(f"stopped by {name}: the trace above is partial")
        code = 128 + result.stopped_by.value
    return code
