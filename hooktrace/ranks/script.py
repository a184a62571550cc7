"""`hooktrace exec --nproc N`: N local ranks of a script through PyTorch's elastic launcher (torchrun),
each rank traced by `hooktrace exec` as under any torchrun; then the agreement of their traces.

The launcher is `python -m torch.distributed.run --standalone` (a free port, one node); every rank
runs `python -m hooktrace exec ... -o PATH SCRIPT ARGS` and writes `PATH.rank{r}.json` (a
temporary folder when no `-o` is given); rank 0 shows its trace. The summary is `hooktrace ranks`'s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from typing import Optional

from ..schema import TraceFormatError
from ..validate import load
from .result import DIED, OK, RankOutcome, RanksResult, rank_trace_path


def exec_ranks(
    nproc: int, exec_args: list[str], script: list[str], output: Optional[str]
) -> tuple[RanksResult, int]:
    """Launch, wait, read each rank's trace: (their agreement, the launcher's exit code).
    `exec_args`: the `exec` options for each rank (not -o, not --nproc)."""
    folder = None
    if output is None:
        folder = tempfile.mkdtemp(prefix="hooktrace-ranks-")
        out = os.path.join(folder, "trace.json")
    else:
        out = output
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "hooktrace",
        "exec",
        *exec_args,
        "-o",
        out,
        *script,
    ]
    try:
        code = subprocess.call(command)
        interrupted = -code if code < 0 else None
        outcomes = []
        for rank in range(nproc):
            path = rank_trace_path(out, rank)
            try:
                trace = load(path)
            except (OSError, TraceFormatError) as exc:
                outcomes.append(RankOutcome(rank, DIED, error=f"wrote no trace ({exc})"))
                continue
            kept = path if folder is None else None
            outcomes.append(RankOutcome(rank, OK, trace_path=kept, trace=trace))
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    from ..analysis.ranks import compare_ranks

    traces = {o.rank: o.trace for o in outcomes if o.trace is not None}
    result = RanksResult(
        nproc=nproc, show_rank=0, ranks=outcomes, comparisons=compare_ranks(traces), interrupted=interrupted
    )
    return result, code
