"""What the `exec` and `ranks` commands do once parsed (SPEC §2b): run a script and show its window's
trace (on one rank, or rank 0 of many), launch N ranks, and say whether per-rank traces agree.
cli.py parses and calls these; they return exit codes and raise UsageError for bad input.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from .options import VIEW_FLAGS, UsageError
from .outputs import emit_page as _emit
from .outputs import is_html
from .outputs import output as _output
from .outputs import stderr_line as _stderr
from .outputs import write as _write

if TYPE_CHECKING:
    from .compare import Side
    from .schema import Trace

EXIT_DIFFERENT = 1


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
    compare: Optional[Callable[[Side], bool]] = None,
) -> int:
    """Run the script; show and write the trace as soon as the window closes; the script's exit code
    (1 more when `compare(observed)`, the `--check`, finds a difference)."""
    from .ranks.result import rank_trace_path
    from .runs.script import ScriptResult, run_script

    def on_trace(result: ScriptResult) -> None:
        trace, rank = result.trace, result.trace.meta.rank
        if rank is None:
            if not (quiet and output is None):
                _output(trace, fmt, output, view, quiet)
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
            for note in result.notes:
                _stderr(f"note: {note}")

    result = run_script(target, options, on_trace)
    shown = result.trace.meta.rank in (None, 0)
    code = result.exit_code
    if result.exit_message is not None:
        _stderr(result.exit_message)
    if result.exception is not None:
        if result.script_traceback:
            sys.stderr.write(result.script_traceback)
        _stderr(f"run failed: {result.error}")
    if compare is not None and shown:
        from .compare import Side

        if not compare(Side(result.trace, False, target.label)):
            code = max(code, EXIT_DIFFERENT)
    if result.stopped_by is not None:
        if shown:
            _stderr(f"stopped by {result.stopped_by.name}: the trace above is partial")
        code = 128 + result.stopped_by.value
    return code


def run_exec_ranks(
    nproc: int,
    options: Any,
    fmt: Optional[str],
    view: dict[str, Any],
    script: list[str],
    as_module: bool,
    output: Optional[Path],
) -> int:
    """`exec --nproc N`: the ranks through torchrun (rank 0 shows its trace), then their agreement."""
    from .ranks.script import exec_ranks

    html = is_html(fmt, output)  # one page of every rank, made here once the ranks have written
    rank_args = ["-s", str(options.start), f"--steps={options.steps}", f"--step-on={options.step_on}"]
    rank_args += ["--keep-running"] if options.keep_running else []
    rank_args += ["--shapes"] if options.shapes else []
    rank_args += [f"--format={fmt}"] if fmt is not None and not html else []
    rank_args += [f"{VIEW_FLAGS[k]}={v}" if v is not True else VIEW_FLAGS[k] for k, v in view.items()]
    script = (["-m"] if as_module else []) + list(script)
    # the ranks write PATH.rank{r}.json whatever the extension; `.json` tells them no page is theirs
    rank_out = output.with_suffix(".json") if html and output is not None and output.suffix else output

    result, launcher = exec_ranks(nproc, rank_args, script, str(rank_out) if rank_out is not None else None)
    traces = {o.rank: o.trace for o in result.ranks if o.trace is not None}
    if html and traces:
        from .render.html import ranks_html

        names = {o.rank: o.trace_path for o in result.ranks if o.trace_path is not None}
        missing = [o.rank for o in result.ranks if o.trace is None]
        _emit(ranks_html(traces, names, missing), output, f"html: {len(traces)} ranks")
    _stderr(result.summary())
    code = result.exit_code
    if code == 0 and launcher != 0:
        code = launcher if launcher > 0 else 128 - launcher
    return code


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


def _missing(by_rank: dict[int, tuple[Path, Trace]]) -> tuple[int, list[int]]:
    """The world size the traces state (else how many there are), and the ranks with no trace."""
    worlds = {t.meta.world_size for _, t in by_rank.values() if t.meta.world_size is not None}
    nproc = worlds.pop() if len(worlds) == 1 else len(by_rank)
    return nproc, sorted(set(range(nproc)) - set(by_rank))


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
        text += f"\nmissing: no trace given for rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
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
