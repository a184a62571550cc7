"""`run --nproc`: ranks started through PyTorch's own launcher, one trace per rank, their agreement."""

from .launch import (
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
    run_options,
    run_ranks,
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
    "run_options",
    "run_ranks",
]
