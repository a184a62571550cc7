"""What every driver shares: the one result type, the driver protocol, and the one place a capture is
opened with hooktrace's analyses.

A driver runs a program under a capture and gives back a `Result`: the factory driver (`run`:
`factory.py`) and the script driver (`exec`: `script.py`) are the two implementations of `Driver`.
Every command shows and ends a result the same way (`outcome.py`: `show`, `finish`), on one process
or on every rank (`hooktrace.ranks`, which builds a rank's driver from its `Job` with `driver_class`).

`open_capture()` is the only `TraceSession(...)` built outside `capture/`: `run`, `hooks`, `exec`,
their ranks and the Python API (`hooktrace.trace`) all open their capture here, so each trace gets
the same surprise rules (docs/surprises.md).
"""

from __future__ import annotations

import importlib
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional, Protocol

from ..schema import Trace

if TYPE_CHECKING:
    from ..capture.session import TraceSession


def open_capture(
    model: Any = None,
    *,
    target: Optional[str] = None,
    shapes: bool = False,
    describe: Optional[Callable[[Trace], str]] = None,
    facts: Optional[dict[str, Any]] = None,
) -> TraceSession:
    """A capture (not yet entered) whose trace carries the surprise rules' findings (torch is
    imported here, not when the module is: the rank launcher reads the drivers' classes); `facts`,
    when given, receives the capture's own facts the rules were given (`--compare-eager` reads them)."""
    from ..analysis.surprises import find_surprises
    from ..capture.session import TraceSession

    analyse: Callable[..., Any] = find_surprises
    if facts is not None:

        def analyse(trace: Trace, **given: Any) -> Any:
            facts.update(given)
            return find_surprises(trace, **given)

    return TraceSession(model, target=target, analyse=analyse, describe=describe, shapes=shapes)


@dataclass
class Result:
    """What a driver gives back: the (possibly partial) trace, and how the program ended.

    `exit_code`: the program's own (a script's `sys.exit` code; 1 when it raised; 0 when it ended or
    hooktrace stopped it after the window); `error`: one line naming where it raised (a hook, a
    module, the script's frame); `traceback`: a script's, without hooktrace's frames (its uncaught
    exception is reported as python reports it), where a factory's is printed only with --traceback; `stopped_by`: the signal that ended the run
    early; `stopped_in`: where it landed ("loading the target": before anything was traced);
    `stopped_after`: the steps after which hooktrace stopped a script (its window closed);
    `exit_message`: `sys.exit("text")`'s text, which Python prints to stderr."""

    trace: Trace
    label: str = ""  # what ran (TARGET, SCRIPT.py, -m MODULE): the name `--check` compares
    exit_code: int = 0
    error: Optional[str] = None
    exception: Optional[BaseException] = None
    traceback: Optional[str] = None
    notes: list[str] = field(default_factory=list)
    stopped_by: Optional[signal.Signals] = None
    stopped_in: Optional[str] = None
    stopped_after: Optional[int] = None
    steps_ended: int = 0
    exit_message: Optional[str] = None
    forked: bool = False  # a process the script forked: it traced nothing and shows nothing
    compared: Any = (
        None  # `exec --compare-eager`: both runs (runs/compare.py `Compared`), when the eager one ran
    )


LOADING = "loading the target"  # `Result.stopped_in` before the program began: nothing traced


def stopped_in(error: str, stop: BaseException) -> str:
    """Where a stop landed, from the line naming it as a failure (`forward_pre hook stall raised
    Stopped: ... in forward` -> `forward_pre hook stall in forward`)."""
    return error.replace(f" raised {type(stop).__name__}: {stop}", "")


class Driver(Protocol):
    """A way to drive a capture. `run` runs the program; `on_trace(result)` is called once, as soon as
    the trace is complete (a script runs on after it with --keep-running); `on_step(step, untraced)`
    as each step begins; `on_armed(True/False)` when the program begins / has ended (a rank defers a
    stop signal from then on, so the trace being built is not cut).

    Under `--nproc`, every rank builds its driver from the job's data (`from_job`); `joins_group`:
    the rank joins the process group before the run (a factory's), or the program does it itself (a
    script, as under torchrun); `own_output`: the program's output reaches the terminal."""

    name: ClassVar[str]
    joins_group: ClassVar[bool]
    own_output: ClassVar[bool]
    first_phase: ClassVar[str]  # what a rank reports first: "loading" (the target), "running" (the script)
    label: str

    def run(
        self,
        on_trace: Callable[[Result], None],
        on_step: Optional[Callable[[int, bool], None]] = None,
        on_armed: Optional[Callable[[bool], None]] = None,
    ) -> Result: ...

    @classmethod
    def from_job(cls, job: dict[str, Any], device: Optional[str]) -> Driver: ...


def driver_class(name: str) -> type[Driver]:
    """The driver a job names: `DRIVER` of the module `hooktrace.runs.<name>` (a new runner is its
    file here and its command in cli.py; no table to extend)."""
    if not name.isidentifier():
        raise ValueError(f"no driver named {name!r}")
    module = importlib.import_module(f"{__package__}.{name}")
    driver: type[Driver] = module.DRIVER
    return driver
