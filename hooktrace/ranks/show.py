"""`run --nproc N` and `exec --nproc N` once parsed: launch the job on every rank, show one rank's
trace (or every rank in one page), the ranks' summary, and end through the one outcome
(`runs.outcome.finish`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from ..compare import Side, safe_lines
from ..options import UsageError, check_nproc
from ..outputs import emit_page, is_html, output, rank_trace_path, stderr_line
from ..outputs import shown as given_path
from ..runs.outcome import EXIT_OK, Shown, finish
from .job import Job
from .result import DEFAULT_TIMEOUT


def run_ranks(
    job: Job, nproc: int, rank: Optional[int], timeout: Optional[float], shown: Shown, golden: Optional[Side]
) -> int:
    """One trace per rank (`-o PATH` -> `PATH.rank{r}.json`), every rank under the one launcher
    (--timeout, hang detection, stop signals); show one rank, then the summary; `--check` compares
    the shown rank with GOLDEN. The exit code."""
    from . import run_ranks as launch  # read at the call: tests put a launcher of their own there

    out, fmt, quiet = shown.output, shown.fmt, shown.quiet
    check_nproc(nproc)  # before the note that names the ranks' files
    if out is not None:
        stderr_line(rank_files_note(given_path(out), nproc))
    ranks = launch(
        job,
        nproc,
        out=str(out) if out is not None else None,
        timeout=timeout if timeout is not None else DEFAULT_TIMEOUT,
        show_rank=rank or 0,
    )
    if ranks.usage_error is not None:
        raise UsageError(ranks.usage_error)
    if is_html(fmt, out):  # every rank in one page, the divergence marked
        from ..render.html import ranks_html

        traces = {o.rank: o.trace for o in ranks.ranks if o.trace is not None}
        if traces:
            names = {o.rank: o.trace_path for o in ranks.ranks if o.trace_path is not None}
            page = ranks_html(traces, names, missing=[o.rank for o in ranks.ranks if o.trace is None])
            emit_page(page, out, f"html: {len(traces)} ranks")
    elif ranks.shown is not None and not quiet:
        output(ranks.shown, fmt, None, shown.view)
    if quiet:  # -q: the ranks' summary only when they failed or diverged
        if ranks.exit_code != EXIT_OK:
            stderr_line(ranks.summary())
    elif fmt in (None, "tree"):
        print(safe_lines(ranks.summary()))
    else:  # keep stdout one document (`-f json | jq`)
        stderr_line(ranks.summary())
    if shown.traceback:
        for failed in ranks.failed:
            if failed.traceback:  # from the rank's elastic error file
                stderr_line(f"rank {failed.rank} ({failed.state}):\n{failed.traceback.rstrip()}")
    if ranks.shown is None:
        return ranks.exit_code
    from ..runs.driver import Result

    # the shown rank's trace, ended as one process's (its failure and stop are in the summary)
    result = Result(ranks.shown, label=f"rank {ranks.show_rank}", exit_code=ranks.exit_code)
    return finish(result, dataclasses.replace(shown, rank=ranks.show_rank), golden)


def rank_files_note(output: str, nproc: int) -> str:
    """What `-o` becomes with --nproc: one trace file per rank, JSON whatever the extension."""
    first, last = rank_trace_path(output, 0), rank_trace_path(output, nproc - 1)
    files = first if nproc == 1 else f"{first} … {last}" if nproc > 2 else f"{first} and {last}"
    note = f"note: --nproc writes one trace per rank: {files}"
    if output.lower().endswith((".html", ".htm")):
        note += f", and {Path(output).name}: every rank in one page"
    elif not output.lower().endswith((".json", ".json.gz")):
        note += f" (JSON, not {Path(output).name}); draw one with: hooktrace render {first} -o {output}"
    return note
