"""`run --nproc` and `exec --nproc`: ranks supervised through PyTorch's elastic launcher, one trace
per rank, their agreement. One launcher for any driver: the job says which (`job.py`).

- `job.py`: `Job`, what every rank runs (the driver, its target or script, its options) as data;
- `launch.py`: `run_ranks`, the parent side (start, watch, stop, collect);
- `worker.py`: one rank (`python -m hooktrace.ranks JOB`): the factory driver or the script driver;
- `result.py`: each rank's outcome, the comparison and the summary prose (pure).
"""

from .launch import Job, run_ranks
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
    "Job",
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
