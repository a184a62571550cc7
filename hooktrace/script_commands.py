"""What the `exec` and `ranks` commands do once parsed (SPEC §2b): run a script and show its window's
trace (on one rank, or rank 0 of many), launch N ranks, and say whether per-rank traces agree.
cli.py parses and calls these; they return exit codes and raise UsageError for bad input.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from .options import VIEW_FLAGS, UsageError
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
            if rank == 0:
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

    rank_args = ["-s", str(options.start), f"--steps={options.steps}", f"--step-on={options.step_on}"]
    rank_args += ["--keep-running"] if options.keep_running else []
    rank_args += ["--shapes"] if options.shapes else []
    rank_args += [f"--format={fmt}"] if fmt is not None else []
    rank_args += [f"{VIEW_FLAGS[k]}={v}" if v is not True else VIEW_FLAGS[k] for k, v in view.items()]
    script = (["-m"] if as_module else []) + list(script)

    result, launcher = exec_ranks(nproc, rank_args, script, str(output) if output is not None else None)
    _stderr(result.summary())
    code = result.exit_code
    if code == 0 and launcher != 0:
        code = launcher if launcher > 0 else 128 - launcher
    return code


def ranks_summary(traces: list[tuple[Path, Trace]]) -> tuple[str, int]:
    """`hooktrace ranks`: run --nproc's agreement summary of (file, trace) pairs, and its exit code.
    A trace says its rank (`meta.rank`; else its position); two of one rank are a UsageError."""
    by_rank: dict[int, tuple[Path, Trace]] = {}
    for i, (path, trace) in enumerate(traces):
        rank = trace.meta.rank if trace.meta.rank is not None else i
        if rank in by_rank:
            raise UsageError(f"{by_rank[rank][0]} and {path} are both rank {rank}; give one file per rank")
        by_rank[rank] = (path, trace)
    from .analysis.ranks import compare_ranks
    from .ranks.result import OK, RankOutcome, RanksResult

    worlds = {t.meta.world_size for _, t in by_rank.values() if t.meta.world_size is not None}
    nproc = worlds.pop() if len(worlds) == 1 else len(by_rank)
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
    missing = sorted(set(range(nproc)) - set(by_rank))
    if missing:
        text += f"\nmissing: no trace given for rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
    return text, result.exit_code
