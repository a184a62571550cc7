"""`hooktrace ranks`: do per-rank traces from any nodes agree (the summary `run --nproc` prints, and
its exit code), and every rank in one page."""

from __future__ import annotations

from pathlib import Path

from ..analysis.ranks import compare_ranks
from ..options import MAX_WORLD_SIZE, UsageError
from ..schema import Trace
from .result import OK, RankOutcome, RanksResult


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
    from ..render.html import ranks_html

    by_rank = _by_rank(traces)
    _, missing = _missing(by_rank)
    return ranks_html(
        {rank: trace for rank, (_, trace) in by_rank.items()},
        names={rank: str(path) for rank, (path, _) in by_rank.items()},
        missing=missing,
    )
