"""Drive `hooktrace exec`: run a user's script as `python SCRIPT.py ARGS` would, and trace a window
of its steps.

From the script's first line, hook registrations are watched (call sites, `prepend`; nothing is
wrapped, capture/steps.py `Registrations`) and step ends are counted (`--step-on`, capture/steps.py
`StepWatch`). The capture itself (`TraceSession` without a model: each outermost module call is a
root) is opened when `start` steps have ended and closed when `steps` more have: only then are
module calls and hook firings traced. When the window closes the trace is handed to `on_trace`,
and the script is stopped there (`Stopped` with its step, exit 0) unless `keep_running`.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

from ..analysis.counts import plural
from ..options import (
    MAX_WORLD_SIZE,
    STEP_BACKWARD,
    STEP_FORWARD,
    STEP_ON,
    STEP_OPTIMIZER,
    UsageError,
    check_steps,
)
from ..schema import Trace
from . import forks
from .as_main import MainState, NotFound, check_module, run_main
from .driver import Result, open_capture, stopped_in
from .failure import describe_error, failing_event, script_frame
from .stop import ScriptSignals, Stopped
from .uncaught import script_traceback

_EARLIER_BACKWARD = (
    "with --step-on forward a step is one outermost module call: the window opened at the end of the "
    "forward of step {before}, and that forward's backward ran inside the window untraced (its "
    "modules' backward hooks and its tensors' hooks are not in the trace; never-fired names that backward "
    "for them); "
    "a training loop is cut where its steps end with --step-on optimizer (the default) or backward"
)
OWN_TRACE = "opened its own hooktrace.trace()"  # the window ends there: one capture at a time
MAX_START = 10**9  # steps a script runs before its window: far past any training run
_STEP_WORDS = {STEP_OPTIMIZER: "optimizer.step()", STEP_BACKWARD: "outermost backward()",
               STEP_FORWARD: "outermost module call"}  # fmt: skip


@dataclass(frozen=True)
class ExecOptions:
    """The window: `start` steps untraced, then `steps` traced; what ends a step; what happens after."""

    start: int = 0
    steps: int = 1
    step_on: str = STEP_OPTIMIZER
    keep_running: bool = False
    shapes: bool = False  # record what each hook received and returned (`--shapes`)

    def check(self) -> ExecOptions:
        if not 0 <= self.start <= MAX_START:
            raise UsageError(
                f"--start {_short(self.start)}: give 0 to {MAX_START:,} steps to run untraced first"
            )
        check_steps(self.steps)
        if self.step_on not in STEP_ON:
            raise UsageError(f"unknown --step-on {self.step_on!r}; use one of {', '.join(STEP_ON)}")
        return self


@dataclass(frozen=True)
class Script:
    """What to run: a file (`path`) or a module (`module`, as `python -m`), and its arguments."""

    path: Optional[str] = None
    module: Optional[str] = None
    args: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"-m {self.module}" if self.module is not None else str(self.path)

    def check(self) -> Script:
        """UsageError for a file that is not there or a module that cannot be found (before torch)."""
        if self.module is not None:
            check_module(self.module)
            return self
        if self.path is None or not os.path.exists(self.path):
            raise UsageError(
                f"script not found: {self.path}; give SCRIPT.py [ARGS]... or -m MODULE [ARGS]..."
            )
        return self

    def for_ranks(self) -> Script:
        """UsageError for a script the ranks of --nproc cannot each read: a pipe (`<(...)`) is read once."""
        if self.path is not None and not os.path.isfile(self.path) and not os.path.isdir(self.path):
            raise UsageError(
                f"{self.path} is not a file (a pipe is read once): --nproc starts one process per rank, "
                "each reading the script; save it to a file and give its path"
            )
        return self


def _rank_meta() -> tuple[Optional[int], Optional[int]]:
    """RANK / WORLD_SIZE as torchrun (or any launcher) sets them, else (None, None). Numbers no
    launcher sets (a rank outside 0..WORLD_SIZE-1, a world past MAX_WORLD_SIZE ranks) are a UsageError:
    a trace must not claim them."""
    rank_text, world_text = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank_text is None or world_text is None:
        return None, None
    text = rank_text, world_text
    if not all(t.strip().lstrip("-").isascii() and t.strip().lstrip("-").isdigit() for t in text):
        return None, None
    if max(len(t.strip()) for t in text) > 20:  # past 64 bits: not read as a number at all
        raise UsageError(f"RANK={text[0][:24]!r} / WORLD_SIZE={text[1][:24]!r}: not a rank of a job")
    rank, world = int(text[0]), int(text[1])
    if not 0 < world <= MAX_WORLD_SIZE or not 0 <= rank < world:
        raise UsageError(
            f"RANK={rank} / WORLD_SIZE={world} is not a rank of a job: give 0 <= RANK < WORLD_SIZE <= {MAX_WORLD_SIZE}"
        )
    return rank, world


def _short(n: int) -> str:
    text = str(n)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"


class _Window:
    """Counts step ends; opens the capture after `start`, closes it after `start + steps`."""

    def __init__(
        self,
        script: Script,
        options: ExecOptions,
        on_trace: Callable[[Result], None],
        on_step: Optional[Callable[[int, bool], None]] = None,
    ) -> None:
        from ..capture.steps import Registrations, StepWatch

        self.script = script
        self.options = options
        self.on_trace = on_trace
        self.on_step = on_step
        self.ended = 0
        self.state = "before"  # -> "open" -> "closed"
        self.session: Any = None
        self.result: Optional[Result] = None
        self.output_error: Optional[BaseException] = None
        self.registrations = Registrations()
        self.held: list[Any] = []  # the roots of the window's calls, alive until it closes
        self.facts: Optional[dict[str, Any]] = None  # filled with the capture's facts (--compare-eager)
        self.thread: Optional[str] = None  # the thread the window closed in, when not the main one
        self.watch = StepWatch(options.step_on, self.step_ended)
        self.forked = False  # set in a child the script forked (`_after_fork_in_child`)
        self.own: Any = None  # the window's own capture, and the script's own trace()'s while open
        self.foreign: Any = None
        self._listening: Any = None
        self.earlier_backward = False  # --step-on forward: an earlier forward's backward ran in it

    def install(self) -> None:
        from ..capture.ledger import CURRENT, Ledger

        self._listening = Ledger()
        self._listening.set(CURRENT, "on_capture", self.on_capture)
        self.registrations.install()
        self.watch.install()
        if self.options.start == 0:
            self.open()

    def restore(self) -> None:
        self.watch.restore()
        self.registrations.restore()
        if self._listening is not None:
            self._listening.restore()

    def on_capture(self, capture: Any, opening: bool) -> None:
        """The script opens (or has closed) a `hooktrace.trace()` of its own. One capture at a time,
        and the script must see what it would untraced: before the window, the registration watch
        pauses until that trace closes (a window due meanwhile opens then); inside the window, the
        window ends there and its trace is the one written."""
        if capture is self.own or self.forked:
            return
        if opening and self.foreign is None:
            self.foreign = capture
            if self.state == "before":
                self.registrations.pause()
            elif self.state == "open":
                self.close(ended_by=OWN_TRACE)
        elif not opening and capture is self.foreign:
            self.foreign = None
            if self.state == "before":
                self.registrations.install()
                if self.ended >= self.options.start:
                    self.open()

    def step_ended(self) -> None:
        if self.forked:  # a forked child (a DataLoader worker, ...) counts, stops and writes nothing
            return
        self.ended += 1
        if self.state == "open":  # their names must outlive a script that ends inside the window
            self.held = self.session.live_roots()
        if self.on_step is not None:  # the next step begins: before the window, a warm-up step
            start = self.options.start
            self.on_step(self.ended - start if self.ended >= start else self.ended, self.ended < start)
        options = self.options
        if self.state == "before":
            if self.ended >= options.start and self.foreign is None:
                self.open()
        elif self.state == "open":
            if self.ended >= options.start + options.steps:
                self.close()
                if not self.runs_on():
                    raise Stopped(step=self.ended)
            else:
                self.session.mark_step()
        elif not self.runs_on() and self.ended >= options.start + options.steps:
            raise Stopped(step=self.ended)  # the script caught Stopped and went on, or the window
            # ended early (the script's own trace() opened in it): stopped where it would have ended

    def runs_on(self) -> bool:
        """Whether the script runs on untraced once the window has closed: with --keep-running, or when
        the window closed in a thread other than the main one. hooktrace stops a script by raising
        `Stopped` in its main thread only: raised in a training thread, it would end that thread alone
        (its traceback printed, the rest of the script going on without it)."""
        return self.options.keep_running or self.thread is not None

    def open(self) -> None:
        from ..capture.steps import open_after

        session = open_capture(target=self.script.label, shapes=self.options.shapes, facts=self.facts)
        self.own = session._capture  # not the script's own trace(): `on_capture` lets it open
        open_after(self.registrations, session)  # the capture sees registrations itself now
        self.session = session
        self.watch.rewrap()
        self.state = "open"
        if self.options.step_on == STEP_FORWARD and self.ended:  # opened at a forward's end
            opened = self.ended

            def backward_begins() -> None:  # before the window's first forward ended: an earlier one's
                if self.state == "open" and self.ended == opened:
                    self.earlier_backward = True

            self.watch.on_backward(backward_begins)

    def close(self, ended_by: Optional[str] = None) -> Result:
        """End the capture and hand the trace over (once)."""
        if self.result is not None:
            return self.result
        if self.forked:  # the parent owns the window, its trace and its output
            self.state = "closed"
            self.result = Result(trace=Trace(), forked=True)
            return self.result
        if self.state == "open":
            self.session.__exit__(None, None, None)
            self.held = []
            self.watch.rewrap()
        elif self.state == "before":  # the script is over before the window opened: nothing to watch
            self.restore()  # (the empty trace's capture cannot open beside the registration watch)
        self.state = "closed"
        if threading.current_thread() is not threading.main_thread():
            self.thread = threading.current_thread().name
        if self.runs_on():  # nothing more to count: the script runs as if untraced
            self.restore()
        self.result = self._result(ended_by)
        try:
            self.on_trace(self.result)
        except BaseException as exc:  # e.g. the output cannot be written: reported after the script
            self.output_error = exc
        return self.result

    def _result(self, ended_by: Optional[str]) -> Result:

        session = self.session
        if session is None:  # the window never opened: an empty trace
            session = open_capture(target=self.script.label)
            with session:
                pass
        rank, world = _rank_meta()
        session.set_meta(target=self.script.label, rank=rank, world_size=world, warmup=self.options.start)
        if self.earlier_backward:
            session.unseen_backward = (
                f"the backward of step {self.options.start - 1}'s forward ran inside the window untraced"
            )
        notes = self._notes(ended_by)
        return Result(trace=session.trace, label=self.script.label, notes=notes, steps_ended=self.ended)

    def _earlier_backward_note(self) -> list[str]:
        return [_EARLIER_BACKWARD.format(before=self.options.start - 1)] if self.earlier_backward else []

    def _notes(self, ended_by: Optional[str]) -> list[str]:
        options = self.options
        words = _STEP_WORDS[options.step_on]
        last = options.start + options.steps
        window = (
            f"step {options.start}" if options.steps == 1 else f"steps {options.start}-{last - 1}"
        ) + f" (a step ends at each {words})"
        if ended_by is None:
            what = "stopped the script there" if not options.keep_running else "the script ran on untraced"
            if self.thread is not None and not options.keep_running:
                what = (
                    f"the window closed in thread {self.thread!r}, not the main thread: hooktrace stops a "
                    "script only in its main thread, so the script ran on untraced (Ctrl-C stops it)"
                )
            return [f"traced {window}; {what}", *self._earlier_backward_note()]
        notes = []
        if self.ended < options.start:
            registered = len(self.registrations.sites)
            live = len(set(self.registrations.sites) - self.registrations.removed)
            notes.append(
                f"the script {ended_by} after {self.ended} step{'s' if self.ended != 1 else ''}, before the "
                f"window opened (--start {options.start}): nothing traced; {plural(registered, 'hook')} "
                f"registered and watched ({live} still registered), none fired in a window"
            )
        else:
            done = self.ended - options.start  # steps that ended inside the window
            ran = f"step {options.start}" if done <= 1 else f"steps {options.start}-{self.ended - 1}"
            ran += (
                f" and step {self.ended}, as far as it went"
                if 0 < done and ended_by.startswith("raised")
                else ""
            )
            if done <= 0:
                ran += ", as far as it went"
            notes.append(
                f"the script {ended_by} inside the window after {plural(done, 'step')} of the {options.steps} "
                f"asked: traced {ran} (a step ends at each {words})"
                + (
                    "; one capture at a time: the script's own trace has the rest"
                    if ended_by == OWN_TRACE
                    else ""
                )
            )
        notes += self._earlier_backward_note()
        ended = ended_by in ("ended", "exited with code 0")
        if self.ended == 0 and ended and options.step_on == STEP_OPTIMIZER:
            notes.append(
                f"the script never called optimizer.step(): every step counted as one; give --step-on "
                f"{STEP_BACKWARD} or --step-on {STEP_FORWARD} to cut it into steps"
            )
        return notes


def _exit_code(exc: SystemExit) -> tuple[int, Optional[str]]:
    """As Python exits on `sys.exit(code)`: None -> 0, an int, anything else printed and 1."""
    code = exc.code
    if code is None:
        return 0, None
    if isinstance(code, int):
        return code, None
    return 1, str(code)


def run_script(
    script: Script,
    options: ExecOptions,
    on_trace: Callable[[Result], None],
    on_step: Optional[Callable[[int, bool], None]] = None,
    window_type: Optional[Callable[..., _Window]] = None,
) -> Result:
    """Run the script, trace its window (`window_type`: exec --compare-eager's runs/compare.py
    CompareWindow); `on_trace(result)` is called once, as soon as the trace is
    complete (the window closed, or the script ended / raised / was stopped first); `on_step(step,
    before_window)` as each step begins (the rank worker reports progress with it).

    Returns the result with the script's exit code. UsageError for a script that cannot be found."""
    options.check()
    script.check()
    _rank_meta()  # RANK / WORLD_SIZE no launcher sets: said before the script runs
    window = (window_type or _Window)(script, options, on_trace, on_step)
    exception: Optional[BaseException] = None
    exit_code, exit_message, stopped_by = 0, None, None
    stopped_after: Optional[int] = None
    stop: Optional[BaseException] = None  # where a stop signal landed
    ended_by = "ended"
    forks.watch()
    with MainState(script.path, script.module, script.args), ScriptSignals() as sigterm:
        forks.RUNNING[:] = [window, sigterm]
        try:
            window.install()
            run_main(script.path, script.module)
        except NotFound:  # `-m` names a module that is not there: nothing ran, nothing is written
            window.on_trace = _nothing
            raise
        except Stopped as exc:
            if exc.signal is None:  # the window closed
                stopped_after, ended_by = exc.step, "was stopped"
            else:
                stopped_by, ended_by, stop = exc.signal, f"was stopped by {exc.signal.name}", exc
        except SystemExit as exc:
            exit_code, exit_message = _exit_code(exc)
            ended_by = f"exited with code {exit_code}"
        except KeyboardInterrupt as exc:
            stopped_by, ended_by, stop = signal.SIGINT, "was interrupted (SIGINT)", exc
        except BaseException as exc:  # the script, the model or a hook raised
            exception, exit_code = exc, 1
            ended_by = f"raised {type(exc).__name__}"
        finally:
            try:
                result = window.close(ended_by=None if window.state == "closed" else ended_by)
            finally:
                forks.RUNNING.clear()
                window.restore()
    if window.output_error is not None:
        raise window.output_error
    result.exit_code = exit_code
    result.exit_message = exit_message
    result.stopped_after = stopped_after
    result.stopped_by = stopped_by
    if stop is not None:
        result.stopped_in = stopped_in(_error(result.trace, stop), stop)
    if exception is not None:
        result.exception = exception
        result.traceback = script_traceback(exception)
        result.error = _error(result.trace, exception)
    return result


def _nothing(result: Result) -> None:
    pass


def _error(trace: Trace, exception: BaseException) -> str:
    """The hook or module it passed through, else the script's own frame that raised it."""
    if failing_event(trace, exception) is not None:
        return describe_error(trace, exception)
    where = script_frame(exception)
    at = f" at {where}" if where else ""
    return f"the script raised {type(exception).__name__}: {exception}{at}"


@dataclass(frozen=True)
class ScriptDriver:
    """The driver of `exec` (runs/driver.py `Driver`): a script run as python would, a window traced.
    Under `--nproc` the script joins the process group itself, as under torchrun, and its output
    reaches the terminal."""

    name: ClassVar[str] = "script"
    joins_group: ClassVar[bool] = False
    own_output: ClassVar[bool] = True
    first_phase: ClassVar[str] = "running"
    script: Script
    options: ExecOptions = ExecOptions()

    @property
    def label(self) -> str:
        return self.script.label

    @classmethod
    def of(cls, argv: Optional[list[str]], as_module: bool, options: ExecOptions) -> ScriptDriver:
        """From exec's command line (SCRIPT.py ARGS... or MODULE ARGS...), checked: UsageError for
        a missing script or module, or bad options."""
        if not argv:
            raise UsageError("give SCRIPT.py [ARGS]... or -m MODULE [ARGS]...")
        name, args = argv[0], tuple(argv[1:])
        script = Script(module=name, args=args) if as_module else Script(path=name, args=args)
        options.check()
        return cls(script.check(), options)

    def run(
        self,
        on_trace: Callable[[Result], None],
        on_step: Optional[Callable[[int, bool], None]] = None,
        on_armed: Optional[Callable[[bool], None]] = None,
    ) -> Result:
        if on_armed is not None:
            on_armed(True)
        try:
            return run_script(self.script, self.options, on_trace, on_step)
        finally:
            if on_armed is not None:
                on_armed(False)

    @classmethod
    def from_job(cls, job: dict[str, Any], device: Optional[str]) -> ScriptDriver:
        first, *args = job["script"]
        module = job["as_module"]
        script = Script(module=first, args=tuple(args)) if module else Script(path=first, args=tuple(args))
        return cls(script, ExecOptions(**job["options"]))


DRIVER = ScriptDriver
