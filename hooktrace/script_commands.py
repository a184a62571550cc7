"""What the `run`, `exec` and `ranks` commands do once parsed (docs/contract.md): where the picture, the
ranks' summary and the notes go once a run is over, and its exit code (a failure, the `--check`
comparison, a stop signal); run a script and show its window's trace (on one rank, or rank 0 of
many); launch N ranks, and say whether per-rank traces agree.
cli.py parses and calls these; they return exit codes and raise UsageError for bad input.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from .compare import Side, print_comparison, safe_lines
from .options import UsageError
from .outputs import emit_page as _emit
from .outputs import is_html
from .outputs import output as _output
from .outputs import stderr_line as _stderr
from .outputs import write as _write

if TYPE_CHECKING:
    from .runs.factory import RunResult
    from .schema import Trace

EXIT_OK, EXIT_DIFFERENT = 0, 1


def _differs(golden: Optional[Side], observed: Trace, name: str, quiet: bool) -> bool:
    """`--check GOLDEN`: whether `observed` differs from it (the differences printed); False without one."""
    if golden is None:
        return False
    return not print_comparison(golden, Side(observed, False, name), check=True, quiet=quiet)


def _notes(notes: list[str], golden: Optional[Side], quiet: bool) -> None:
    """A run's notes on stderr; none with `--check GOLDEN -q`, which prints only the differences."""
    if quiet and golden is not None:
        return
    for note in notes:
        _stderr(f"note: {note}")


def run_outcome(
    result: RunResult, label: str, golden: Optional[Side], quiet: bool, show_traceback: bool
) -> int:
    """After `run` has shown its trace: the run's notes, its failure, the `--check` comparison and the
    signal that stopped it, on stderr; the exit code."""
    _notes(result.notes, golden, quiet)
    code = EXIT_OK
    if result.exception is not None:
        if show_traceback:
            exc = result.exception
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        _stderr(f"run failed: {result.error}")
        code = EXIT_DIFFERENT
    if _differs(golden, result.trace, label, quiet):
        code = EXIT_DIFFERENT
    if result.stopped_by is not None:
        _stderr(f"stopped by {result.stopped_by.name}: the trace above is partial")
        code = 128 + result.stopped_by.value
    return code


def run_ranks(
    job: Any,
    nproc: int,
    rank: Optional[int],
    timeout: Optional[float],
    fmt: Optional[str],
    output: Optional[Path],
    golden: Optional[Side],
    view: dict[str, Any],
    show_traceback: bool = False,
    quiet: bool = False,
) -> int:
    """`run --nproc N` and `exec --nproc N` (`job`: ranks.launch.Job): one trace per rank (`-o PATH`
    -> `PATH.rank{r}.json`), every rank under the one launcher (--timeout, hang detection, stop
    signals); show one rank, then the summary; `--check` compares the shown rank with GOLDEN."""
    from .ranks import DEFAULT_TIMEOUT
    from .ranks import run_ranks as launch

    if output is not None:
        _stderr(rank_files_note(str(output), nproc))
    ranks = launch(
        job,
        nproc,
        out=str(output) if output is not None else None,
        timeout=timeout if timeout is not None else DEFAULT_TIMEOUT,
        show_rank=rank or 0,
    )
    if ranks.usage_error is not None:
        raise UsageError(ranks.usage_error)
    html = is_html(fmt, output)
    if html:  # every rank in one page, the divergence marked
        from .render.html import ranks_html

        traces = {o.rank: o.trace for o in ranks.ranks if o.trace is not None}
        if traces:
            names = {o.rank: o.trace_path for o in ranks.ranks if o.trace_path is not None}
            page = ranks_html(traces, names, missing=[o.rank for o in ranks.ranks if o.trace is None])
            _emit(page, output, f"html: {len(traces)} ranks")
    elif ranks.shown is not None and not quiet:
        _output(ranks.shown, fmt, None, view)
    if quiet:  # -q: the ranks' summary only when they failed or diverged
        if ranks.exit_code != EXIT_OK:
            _stderr(ranks.summary())
    elif fmt in (None, "tree"):
        print(safe_lines(ranks.summary()))
    else:  # keep stdout one document (`-f json | jq`)
        _stderr(ranks.summary())
    if show_traceback:
        for failed in ranks.failed:
            if failed.traceback:  # from the rank's elastic error file
                _stderr(f"rank {failed.rank} ({failed.state}):\n{failed.traceback.rstrip()}")
    code = ranks.exit_code
    if ranks.shown is not None and _differs(golden, ranks.shown, f"rank {ranks.show_rank}", quiet):
        code = max(code, EXIT_DIFFERENT)
    return code


def rank_files_note(output: str, nproc: int) -> str:
    """What `-o` becomes with --nproc: one trace file per rank, JSON whatever the extension."""
    from .ranks.result import rank_trace_path

    first, last = rank_trace_path(output, 0), rank_trace_path(output, nproc - 1)
    files = first if nproc == 1 else f"{first} … {last}" if nproc > 2 else f"{first} and {last}"
    note = f"note: --nproc writes one trace per rank: {files}"
    if output.lower().endswith((".html", ".htm")):
        note += f", and {Path(output).name}: every rank in one page"
    elif not output.lower().endswith((".json", ".json.gz")):
        note += f" (JSON, not {Path(output).name}); draw one with: hooktrace render {first} -o {output}"
    return note


def exec_target(
    script: Optional[list[str]],
    as_module: bool,
    start: int,
    steps: int,
    step_on: str,
    keep_running: bool,
    shapes: bool = False,
) -> tuple[Any, Any]:
    """(the Script, its ExecOptions), checked: UsageError for a missing script or module, bad options."""
    from .runs.script import ExecOptions, Script

    if not script:
        raise UsageError("give SCRIPT.py [ARGS]... or -m MODULE [ARGS]...")
    name, args = script[0], tuple(script[1:])
    target = Script(module=name, args=args) if as_module else Script(path=name, args=args)
    options = ExecOptions(start, steps, step_on, keep_running, shapes).check()
    target.check()
    return target, options


def run_exec(
    target: Any,
    options: Any,
    fmt: Optional[str],
    output: Optional[Path],
    view: dict[str, Any],
    quiet: bool = False,
    golden: Optional[Side] = None,
) -> int:
    """Run the script; show and write the trace as soon as the window closes; the script's exit code
    (1 more when the trace differs from `golden`, the `--check`)."""
    from .ranks.result import rank_trace_path
    from .runs.script import ScriptResult, run_script
    from .runs.uncaught import report_uncaught

    def on_trace(result: ScriptResult) -> None:
        trace, rank = result.trace, result.trace.meta.rank
        if rank is None:
            if not (quiet and output is None):
                _output(trace, fmt, output, view, quiet, keep=True)
        else:  # under torchrun: every rank writes its file, only rank 0 shows the trace
            if output is not None:
                _write(trace, Path(rank_trace_path(str(output), rank)), None)
            if rank == 0 and output is not None and is_html(fmt, output):  # a page needs every rank's file
                files = rank_trace_path(str(output), "*")
                _stderr(
                    f"note: each rank writes {files}; every rank in one page: hooktrace ranks {files} -o {output}"
                )
            elif rank == 0:
                _output(trace, fmt, None, view)
        if rank in (None, 0):
            _notes(result.notes, golden, quiet)

    result = run_script(target, options, on_trace)
    if result.forked:  # a child the script forked (a DataLoader worker, ...): it ends as untraced
        return _as_python(result)
    shown = result.trace.meta.rank in (None, 0)
    code = result.exit_code
    if result.exit_message is not None:
        _stderr(result.exit_message)
    if result.exception is not None:
        report_uncaught(result.exception)  # the script's sys.excepthook, as python calls it
        _stderr(f"run failed: {result.error}")
    if shown and _differs(golden, result.trace, target.label, quiet):
        code = max(code, EXIT_DIFFERENT)
    if result.stopped_by is not None:
        if shown:
            _stderr(f"stopped by {result.stopped_by.name}: the trace above is partial")
        code = 128 + result.stopped_by.value
    return code


def _as_python(result: Any) -> int:
    """How a process ends as python would end it, and nothing of hooktrace's: its exit code."""
    from .runs.uncaught import report_uncaught

    if result.exit_message is not None:
        print(result.exit_message, file=sys.stderr)
    if result.exception is not None:
        report_uncaught(result.exception)
    return int(result.exit_code)


def _by_rank(traces: list[tuple[Path, Trace]]) -> dict[int, tuple[Path, Trace]]:
    """(file, trace) pairs by rank: a trace says its rank (`meta.rank`; else its position); two of one
    rank are a UsageError."""
    by_rank: dict[int, tuple[Path, Trace]] = {}
    for i, (path, trace) in enumerate(traces):
        rank = trace.meta.rank if trace.meta.rank is not None else i
        if rank in by_rank:
            raise UsageError(f"{by_rank[rank][0]} and {path} are both rank {rank}; give one file per rank")
        by_rank[rank] = (path, trace)
    return by_rank


MAX_WORLD_SIZE = 1 << 20  # more ranks than any job runs: a trace that says more is refused, not listed


def _missing(by_rank: dict[int, tuple[Path, Trace]]) -> tuple[int, list[int]]:
    """The world size the traces state (else how many there are), and the ranks with no trace (a
    world size past MAX_WORLD_SIZE, read from a file, is a UsageError: listing it would fill the memory)."""
    for path, trace in by_rank.values():
        world = trace.meta.world_size
        if world is not None and not 0 < world <= MAX_WORLD_SIZE:
            raise UsageError(
                f"{path} says world_size {_short_number(world)}: at most {MAX_WORLD_SIZE} ranks are compared"
            )
    worlds = {t.meta.world_size for _, t in by_rank.values() if t.meta.world_size is not None}
    nproc = worlds.pop() if len(worlds) == 1 else len(by_rank)
    return nproc, [r for r in range(nproc) if r not in by_rank]


def _short_number(n: int) -> str:
    text = str(n) if abs(n) < 10**30 else f"{str(n)[:12]}... ({len(str(abs(n)))} digits)"
    return text


def _listed(ranks: list[int], most: int = 20) -> str:
    shown = ", ".join(map(str, ranks[:most]))
    return shown if len(ranks) <= most else f"{shown} and {len(ranks) - most} more"


def ranks_summary(traces: list[tuple[Path, Trace]]) -> tuple[str, int]:
    """`hooktrace ranks`: run --nproc's agreement summary of (file, trace) pairs, and its exit code."""
    by_rank = _by_rank(traces)
    from .analysis.ranks import compare_ranks
    from .ranks.result import OK, RankOutcome, RanksResult

    nproc, missing = _missing(by_rank)
    outcomes = [
        RankOutcome(rank, OK, trace_path=str(path), trace=trace)
        for rank, (path, trace) in sorted(by_rank.items())
    ]
    result = RanksResult(
        nproc=nproc,
        show_rank=min(by_rank),
        ranks=outcomes,
        comparisons=compare_ranks({rank: trace for rank, (_, trace) in by_rank.items()}),
    )
    text = result.summary()
    if missing:
        text += f"\nmissing: no trace given for rank{'s' if len(missing) > 1 else ''} {_listed(missing)}"
    return text, result.exit_code


def ranks_page(traces: list[tuple[Path, Trace]]) -> str:
    """`hooktrace ranks ... -f html`: every rank in one page (a selector, the first divergence marked),
    each rank's file named beside it, the ranks with no trace listed."""
    from .render.html import ranks_html

    by_rank = _by_rank(traces)
    _, missing = _missing(by_rank)
    return ranks_html(
        {rank: trace for rank, (_, trace) in by_rank.items()},
        names={rank: str(path) for rank, (path, _) in by_rank.items()},
        missing=missing,
    )
