"""What a `run --nproc N` gives back: each rank's outcome, their comparison, and the summary prose.

Pure data: no torch, no processes. `launch.py` fills it in; the CLI prints `summary()` and exits
with `exit_code`.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Optional

from ..analysis.counts import count, plural
from ..analysis.ranks import RankComparison
from ..outputs import rank_trace_path as rank_trace_path  # where rank r writes its trace
from ..schema import Trace

DEFAULT_TIMEOUT = 60.0

# Rank states. The worker's exit code says the first five (see `EXIT_CODES`); the launcher decides
# `hung` (it stopped the rank for overrunning --timeout) and `died` (killed by a signal, or ended
# without saying why).
OK, FAILED, USAGE, CRASHED, STOPPED = "ok", "failed", "usage", "crashed", "stopped"
HUNG, DIED = "hung", "died"
# How a worker's exit code names its state (`python -m hooktrace.ranks` exits with these).
EXIT_CODES = {0: OK, 1: FAILED, 2: USAGE, 3: CRASHED, 4: STOPPED}
STATE_EXIT = {state: code for code, state in EXIT_CODES.items()}

# What a collective raises when the peer process died or never came (gloo; NCCL's watchdog says timed out).
_PEER_ERRORS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Timed out waiting",
    "timed out",
)


@dataclass
class RankOutcome:
    """What one rank did: its state, its error (if any) and the trace it wrote (possibly partial).

    `trace_path` is where the trace was written, or None when it was not kept (no `-o`) or not
    written; `traceback` comes from the rank's elastic error file; `ended_at` is when the launcher
    saw the rank's process end (its monotonic clock), used to order failures.
    """

    rank: int
    state: str
    error: Optional[str] = None
    trace_path: Optional[str] = None
    trace: Optional[Trace] = None
    notes: list[str] = field(default_factory=list)
    exitcode: Optional[int] = None
    traceback: Optional[str] = None
    ended_at: Optional[float] = None

    @property
    def waited_on_peer(self) -> bool:
        """Failed in a collective because another rank died or did not come (a consequence, not a cause)."""
        return self.state == FAILED and any(p in (self.error or "") for p in _PEER_ERRORS)

    def describe(self) -> str:
        if self.trace is None:
            written = " (no trace written)"
        elif self.trace_path is None:
            written = " (trace not kept: give -o PATH to keep every rank's trace)"
        else:
            written = f" -> {self.trace_path}"
        size = ""
        if self.trace is not None:
            size = f", {count(self.trace).phrase()}"
        partial = " (partial)" if self.trace is not None and self.state != OK else ""
        head = f"rank {self.rank}: {self.state}{size}{written}{partial}"
        return f"{head}\n  {self.error}" if self.error else head


@dataclass
class RanksResult:
    """Every rank's outcome and the comparison of their hook orders.

    `exit_code`: 0 the ranks agree, 1 a rank failed or they diverge, 2 bad usage on every rank,
    128 + signal number when the run was interrupted (130 Ctrl-C, 143 SIGTERM).
    """

    nproc: int
    show_rank: int
    ranks: list[RankOutcome]
    comparisons: list[RankComparison]
    timeout: float = DEFAULT_TIMEOUT
    timed_out: Optional[str] = None  # why the launcher stopped every rank for --timeout
    interrupted: Optional[int] = None  # the signal that stopped the run (SIGINT / SIGTERM)

    @property
    def shown(self) -> Optional[Trace]:
        """The trace of `show_rank` (None when that rank wrote nothing)."""
        return self.ranks[self.show_rank].trace if self.show_rank < len(self.ranks) else None

    @property
    def trace_paths(self) -> list[str]:
        return [o.trace_path for o in self.ranks if o.trace is not None and o.trace_path]

    @property
    def failed(self) -> list[RankOutcome]:
        return [o for o in self.ranks if o.state != OK]

    @property
    def first_failure(self) -> Optional[RankOutcome]:
        """The rank that caused the failure: the first to fail on its own, else the one the others waited on."""
        if not self.failed:
            return None
        own = [o for o in self.failed if o.state not in (STOPPED, HUNG) and not o.waited_on_peer]
        stuck = [o for o in self.failed if o.state in (STOPPED, HUNG)]
        if not own and stuck and any(o.waited_on_peer for o in self.failed):
            own = stuck  # the others failed in a collective this rank never reached
        if not own:
            own = [o for o in self.failed if o.state == HUNG]
        return min(own or self.failed, key=lambda o: (o.ended_at is None, o.ended_at or 0.0, o.rank))

    @property
    def diverged(self) -> bool:
        return any(not c.agree for c in self.comparisons)

    @property
    def usage_error(self) -> Optional[str]:
        """The bad-usage message when every rank stopped on it before running (exit 2)."""
        if self.interrupted is not None:
            return None
        errors = {o.error for o in self.ranks if o.state == USAGE}
        if len(errors) == 1 and all(o.state in (USAGE, STOPPED, DIED) for o in self.ranks):
            return errors.pop()
        return None

    @property
    def exit_code(self) -> int:
        if self.interrupted is not None:
            return 128 + self.interrupted
        if self.usage_error is not None:
            return 2
        return 1 if self.failed or self.diverged or len(self.ranks) != self.nproc else 0

    def summary(self) -> str:
        """The per-rank agreement summary printed under the tree of `show_rank`."""
        lines = [f"{self.nproc} rank{'s' if self.nproc != 1 else ''} (showing rank {self.show_rank}):"]
        lines += ["  " + o.describe().replace("\n", "\n  ") for o in self.ranks]
        lines += self._notes()
        if self.interrupted is not None:
            lines.append(f"interrupted by {signal.Signals(self.interrupted).name}: stopped every rank")
        if self.timed_out:
            lines.append(f"stopped every rank after --timeout {self.timeout:g}s: {self.timed_out}")
        lines += self._failures()
        lines += self._agreement()
        if len(self.trace_paths) >= 2:
            lines.append(f"compare two ranks: hooktrace diff {self.trace_paths[0]} {self.trace_paths[1]}")
        elif sum(o.trace is not None for o in self.ranks) >= 2 and not self.trace_paths:
            lines.append(
                "keep every rank's trace with -o PATH (PATH.rank0.json, ...) to compare them with hooktrace diff"
            )
        return "\n".join(lines)

    def _notes(self) -> list[str]:
        notes: dict[str, list[int]] = {}
        for o in self.ranks:
            for note in o.notes:
                notes.setdefault(note, []).append(o.rank)
        lines = []
        for note, on in notes.items():
            where = "every rank" if len(on) == len(self.ranks) else ", ".join(f"rank {r}" for r in on)
            lines.append(f"note ({where}): {note}")
        return lines

    def _failures(self) -> list[str]:
        if not self.failed:
            return []
        lines = ["ranks failed: " + ", ".join(f"rank {o.rank} {o.state}" for o in self.failed)]
        first = self.first_failure
        if first is not None and len(self.failed) > 1 and self.interrupted is None:
            if first.state in (STOPPED, HUNG):
                lines.append(f"rank {first.rank} held the others up: they waited for it; it was in")
                lines.append(f"  {first.error}")
            else:
                lines.append(f"first to fail: rank {first.rank} ({first.state}): {first.error}")
        return lines

    def _agreement(self) -> list[str]:
        present = [o.rank for o in self.ranks if o.trace is not None]
        if self.nproc == 1:
            return ["one rank: no other hook order to compare with"]
        if len(present) < 2:
            return ["hook orders not compared: fewer than two ranks wrote a trace"]
        if self.interrupted is not None:  # each rank stopped wherever it was: an end differs by nature
            return ["hook orders not compared: the ranks were interrupted, each at its own point"]
        if not self.diverged:
            events = self.comparisons[0].events[0] if self.comparisons else 0
            ranks = ", ".join(str(r) for r in present)
            return [f"ranks agree: same hook order on ranks {ranks} ({plural(events, 'hook call')} each)"]
        bad = [c for c in self.comparisons if not c.agree]
        lines = ["ranks diverge: " + ", ".join(f"rank {c.rank} differs from rank {c.reference}" for c in bad)]
        states = {o.rank: o.state for o in self.ranks}
        for c in bad:
            partial = states.get(c.rank) != OK or states.get(c.reference) != OK
            lines.append(c.describe(partial=partial))
        return lines
