"""`run --nproc`: ranks supervised through PyTorch's elastic launcher, one trace per rank, their agreement.

- `launch.py`: `run_ranks`, the parent side (start, watch, stop, collect);
- `worker.py`: one rank (`python -m hooktrace.ranks JOB`);
- `result.py`: each rank's outcome, the comparison and the summary prose (pure).
"""

from .launch import run_ranks
from .result import (
    CRASHED,
    DEFAULT_TIMEOUT,
    DIED,
    FAILED,
    HUNG,
    OK,
    STOPPED,
    USAGE,
    RankOutcome,
    RanksResult,
    rank_trace_path,
)

__all__ = [
    "CRASHED",
    "DEFAULT_TIMEOUT",
    "DIED",
    "FAILED",
    "HUNG",
    "OK",
    "STOPPED",
    "USAGE",
    "RankOutcome",
    "RanksResult",
    "rank_trace_path",
    "run_ranks",
]
