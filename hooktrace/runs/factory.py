"""Drive a run: call the factory inside the capture, then forward, backward and the optimizer step
for N steps; stop cleanly on SIGINT / SIGTERM.

Also the hooks a factory leaves registered, for `hooktrace hooks`: the factory is called inside a
capture, nothing runs.
"""

from __future__ import annotations

import inspect
import signal
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

from ..analysis.counts import plural
from ..capture.session import check_torch
from ..capture.shims import in_backward
from ..capture.steps import Registrations, open_after
from ..capture.views import UnsupportedTorch
from ..inputs import Prepared, coerce_result, compute_loss, prepare, resolve_device
from ..kinds import BACKWARD, FORWARD, HOOK, OPTIMIZER_PHASE
from ..options import RunOptions, UsageError
from ..schema import Trace
from ..target import Factory, exec_command
from .driver import LOADING, Result, open_capture, stopped_in
from .failure import describe_error, failing_event, meta_failure
from .stop import Stopped, StopSignals


def _check_torch() -> None:
    """A torch whose source the capture cannot rewrite is bad input (exit 2), found before the factory runs."""
    try:
        check_torch()
    except UnsupportedTorch as exc:
        raise UsageError(str(exc)) from exc


def _call_factory(factory: Factory) -> Any:
    try:
        result = factory()
        if inspect.iscoroutine(result):  # `async def make()`: never awaited, closed (no warning left)
            result.close()
            raise UsageError(
                f"the factory {factory.label} is async (it returned a coroutine); hooktrace calls it "
                "without an event loop: make it a plain def (it may call asyncio.run itself)"
            )
        return result
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(
            f"the factory {factory.label} raised {type(exc).__name__}: {exc}; "
            "fix it (--traceback shows where)"
        ) from exc
    except SystemExit as exc:
        if factory.script:
            raise UsageError(
                f"the factory {factory.label} called sys.exit({exc.code!r}): this is a script: "
                f"`{exec_command(factory.spec)}` (run takes a factory that returns the model)"
            ) from exc
        raise UsageError(
            f"the factory {factory.label} called sys.exit({exc.code!r}); return the model instead"
        ) from exc
    except (Stopped, KeyboardInterrupt):
        raise
    except BaseException as exc:  # GeneratorExit, a library's own BaseException: still the factory's
        raise UsageError(
            f"the factory {factory.label} raised {type(exc).__name__}: {exc}; fix it (--traceback shows where)"
        ) from exc


@dataclass
class _Progress:
    """Where the steps are: which step, and which part of it (forward, loss, backward, optimizer);
    `warmup`: a warm-up step (untraced)."""

    step: int = 0
    stage: str = "setup"
    warmup: bool = False

    def in_model(self) -> bool:
        """A module call or a backward pass is in progress (what `registered_during_run` means)."""
        return self.stage == FORWARD or in_backward()


class _Capture:
    """The capture of one run. Without warm-up it is open from before the factory is called. With
    `--warmup N`, the factory and the warm-up steps run under the registration watch that `exec`
    keeps before its window (capture/steps.py: call sites and flags seen, nothing wrapped, no
    per-call cost), and `open()` opens it before the first traced step."""

    def __init__(self, spec: str, options: RunOptions, progress: _Progress) -> None:
        self.session = open_capture(target=spec, shapes=options.shapes)
        self.registrations = Registrations(progress.in_model) if options.warmup else None
        self.opened = False

    def __enter__(self) -> _Capture:
        if self.registrations is None:
            self.session.__enter__()
            self.opened = True
        else:
            self.registrations.install()
        return self

    def open(self) -> None:
        if not self.opened and self.registrations is not None:
            open_after(self.registrations, self.session)
            self.opened = True

    def __exit__(self, *exc: Any) -> None:
        if self.opened:
            self.session.__exit__(*exc)
            return
        if self.registrations is not None:
            self.registrations.restore()
            self.session.known_sites(dict(self.registrations.sites))
        with self.session:  # the run stopped before the traced steps: an empty trace
            pass

    def removed_in_warmup(self) -> int:
        """Hooks registered (by the factory or in warm-up) and removed before the traced steps."""
        return len(self.registrations.removed) if self.registrations is not None else 0


def run(
    factory: Factory,
    options: RunOptions = RunOptions(),
    *,
    stop_signals: bool = False,
    on_step: Optional[Callable[[int, bool], None]] = None,
    on_armed: Optional[Callable[[bool], None]] = None,
) -> Result:
    """Load, run and trace. UsageError for bad input; an exception from the model is caught and reported.

    `on_step(step, warmup)` is called as each step starts, warm-up steps (numbered from 0 too) with
    `warmup` true (`run --nproc` reports the ranks' progress with it).

    stop_signals: SIGINT/SIGTERM (main thread only) stop the run; the partial trace is returned with
    `stopped_by` set. The rank worker, which handles signals itself, leaves this off and passes
    `on_armed`: called with True when the factory and the steps begin to run, False when they have
    ended (from then on a stop signal must not cut the trace being built: the worker defers it)."""
    options.check()
    _check_torch()
    resolve_device(options.device)  # CUDA absent: say so before the (maybe slow) factory runs
    notes: list[str] = []
    exception: Optional[BaseException] = None
    stopped: Optional[int] = None
    stop: Optional[BaseException] = None  # where the stop landed
    loaded = False
    progress = _Progress(warmup=options.warmup > 0)
    with factory.on_sys_path(), StopSignals(stop_signals) as signals:
        with _Capture(factory.spec, options, progress) as capture:
            t = capture.session
            signals.armed = True
            if on_armed is not None:
                on_armed(True)
            try:
                target = coerce_result(_call_factory(factory), factory.label)
                loaded = True
                t.attach(target.model)
                prepared = prepare(target, options)
                notes += prepared.notes
                t.set_meta(
                    device=str(prepared.device),
                    target=factory.spec,
                    steps=options.steps,
                    warmup=options.warmup,
                )
                for step in range(options.warmup):
                    progress.step = step
                    if on_step is not None:
                        on_step(step, True)
                    _step(prepared, options.backward, notes, progress)
                progress.warmup, progress.stage = False, "setup"
                capture.open()
                for step in range(options.steps):
                    if step:
                        t.mark_step()
                    progress.step = step
                    if on_step is not None:
                        on_step(step, False)
                    _step(prepared, options.backward, notes, progress)
            except Stopped as exc:
                stopped, stop = exc.signal, exc
            except KeyboardInterrupt as exc:  # SIGINT with Python's own handler (stop_signals off)
                stopped, stop = signal.SIGINT, exc
            except UsageError:
                raise
            except BaseException as exc:  # the model or a hook raised (sys.exit too): keep the partial trace
                exception = exc
            finally:
                signals.armed = False
                if on_armed is not None:
                    on_armed(False)
        stopped = stopped or signals.pending
    t.set_meta(backward=backward_meta(options.backward, notes, exception or stopped))
    trace = t.trace
    if options.warmup:
        notes.append(
            _warmup_note(options.warmup, capture.removed_in_warmup(), progress, exception or stopped)
        )
    if not options.backward:
        notes.append("backward skipped (--no-backward)")
    error = describe_error(trace, exception) if exception is not None else None
    if exception is not None and progress.warmup:
        error = (
            f"the run raised {type(exception).__name__}: {exception} in warm-up step {progress.step} "
            f"({progress.stage}), before tracing began; run without --warmup to see where"
        )
    if exception is not None and prepared_inputs_rejected(trace, exception, progress, options):
        raise UsageError(_rejected_message(trace, exception, error or "", options, prepared)) from exception
    return Result(
        trace=trace,
        label=factory.spec,
        exit_code=0 if exception is None else 1,
        error=error,
        exception=exception,
        notes=notes,
        stopped_by=signal.Signals(stopped) if stopped is not None else None,
        stopped_in=None
        if stop is None
        else stopped_in(describe_error(trace, stop), stop)
        if loaded
        else LOADING,
    )


@dataclass
class FactoryDriver:
    """The driver of `run` (runs/driver.py `Driver`): a factory's model stepped under the capture.
    `stop_signals`: SIGINT/SIGTERM/SIGHUP stop it (one process); a rank handles them itself."""

    name: ClassVar[str] = "factory"
    joins_group: ClassVar[bool] = True
    own_output: ClassVar[bool] = False
    first_phase: ClassVar[str] = "loading"
    factory: Factory
    options: RunOptions = RunOptions()
    stop_signals: bool = False

    @property
    def label(self) -> str:
        return self.factory.spec

    def run(
        self,
        on_trace: Callable[[Result], None],
        on_step: Optional[Callable[[int, bool], None]] = None,
        on_armed: Optional[Callable[[bool], None]] = None,
    ) -> Result:
        result = run(
            self.factory, self.options, stop_signals=self.stop_signals, on_step=on_step, on_armed=on_armed
        )
        on_trace(result)
        return result

    @classmethod
    def from_job(cls, job: dict[str, Any], device: Optional[str]) -> FactoryDriver:
        from ..target import load_factory

        return cls(load_factory(job["target"]), RunOptions(**dict(job["options"], device=device)))


DRIVER = FactoryDriver


def _warmup_note(warmup: int, removed: int, progress: _Progress, interrupted: Any) -> str:
    """What the warm-up did: how many steps ran untraced, and what of them the trace cannot show."""
    if interrupted is not None and progress.warmup:
        return (
            f"the run ended in warm-up step {progress.step} of {warmup}, before the traced steps: no "
            "events; the hooks registered so far are in the trace"
        )
    text = f"{plural(warmup, 'warm-up step')} ran untraced first; the traced steps are numbered from 0"
    if removed:
        verb = "is" if removed == 1 else "are"
        text += f"; {plural(removed, 'hook')} registered and removed before them {verb} not in the trace"
    return text


def backward_meta(backward: bool, notes: list[str], interrupted: Any) -> Optional[str]:
    """`meta.backward`: "off" (--no-backward), "no-grad" (skipped: nothing required grad), "ran" (every
    step), None when the run raised or was stopped (the surprise rules then say what the events show)."""
    if not backward:
        return "off"
    if any(note.startswith("backward skipped") for note in notes):
        return "no-grad"
    return "ran" if interrupted is None else None


def prepared_inputs_rejected(
    trace: Trace, exception: BaseException, progress: _Progress, options: RunOptions
) -> bool:
    """The generated `--input` tensors did not fit: the exception came out of the model's own code
    (not a hook) during the first forward call. Decided by where it was raised, not by its words."""
    if not options.input_shapes or progress.step != 0 or progress.stage != FORWARD:
        return False
    if not isinstance(exception, Exception):
        return False
    if trace.meta.dry_run and meta_failure(exception) is not None:  # meta's doing, not the shape's
        return False
    event = failing_event(trace, exception)
    return event is None or event.type != HOOK


def _rejected_message(
    trace: Trace, exception: BaseException, error: str, options: RunOptions, prepared: Prepared
) -> str:
    given = " ".join(
        [f"--input {s}" for s in options.input_shapes]
        + ([f"--dtype {options.dtype}"] if options.dtype else [])
    )
    event = failing_event(trace, exception)
    kind = next((m.type for m in trace.modules if event is not None and m.path == event.module), "")
    floating = all(getattr(a, "is_floating_point", lambda: True)() for a in prepared.inputs.args)
    mismatch = _float_dtype_mismatch(prepared)
    if floating and kind in ("Embedding", "EmbeddingBag"):
        hint = f"{kind} takes indices: add --dtype int64"
    elif mismatch is not None:
        hint = (
            f"the inputs are {mismatch[0]} but the model's parameters are {mismatch[1]}: give --dtype "
            f"{mismatch[1]}, or leave --dtype out (inputs then take the parameters' dtype)"
        )
    elif not floating and any(p.is_floating_point() for p in prepared.model.parameters()):
        hint = "give a floating --dtype (e.g. --dtype float32) unless it takes indices, or another shape"
    elif floating and any(not p.is_floating_point() for p in prepared.model.parameters()):
        hint = "give the shape it expects, or --dtype int64 if it takes indices"
    else:
        hint = "give the shape it expects (or --dtype int64 if it takes indices)"
    return f"the model rejected {given}: {error}; {hint}"


def _float_dtype_mismatch(prepared: Prepared) -> Optional[tuple[str, str]]:
    """(inputs' dtype, parameters' dtype) when floating inputs and the model's floating parameters
    differ in dtype (`--dtype bfloat16` into a float32 model), else None."""
    inputs = {a.dtype for a in prepared.inputs.args if getattr(a, "is_floating_point", lambda: False)()}
    params = {p.dtype for p in prepared.model.parameters() if p.is_floating_point()}
    if len(inputs) != 1 or len(params) != 1 or inputs == params:
        return None
    return str(inputs.pop()).removeprefix("torch."), str(params.pop()).removeprefix("torch.")


def _step(prepared: Prepared, backward: bool, notes: list[str], progress: _Progress) -> None:
    progress.stage = FORWARD
    output = prepared.model(*prepared.inputs.args, **prepared.inputs.kwargs)
    if not backward:
        if prepared.optimizer is not None and "optimizer step skipped (--no-backward)" not in notes:
            notes.append("optimizer step skipped (--no-backward)")
        return
    progress.stage = "loss"
    loss = compute_loss(output, prepared.loss)
    if loss is None:
        note = "backward skipped: nothing in the output requires grad"
        if prepared.loss is not None:
            note = "backward skipped: loss(output) is not a tensor that requires grad"
        if note not in notes:
            notes.append(note)
        return
    progress.stage = BACKWARD
    loss.backward()
    if prepared.optimizer is not None:
        progress.stage = OPTIMIZER_PHASE
        prepared.optimizer.step()
        prepared.optimizer.zero_grad()


# -- held hooks (`hooktrace hooks`) --------------------------------------------------------------


@dataclass
class HeldHooks:
    """The hooks a factory left registered: its trace, and the ids still in PyTorch's dicts."""

    trace: Trace
    live: set[int]


def held_hooks(factory: Factory) -> HeldHooks:
    """Call the factory inside a capture, without running the model; the trace holds every hook."""
    _check_torch()
    with open_capture(target=factory.spec) as t:
        target = coerce_result(_call_factory(factory), factory.label)
        t.attach(target.model)
        t.set_meta(target=factory.spec, steps=0)
    return HeldHooks(t.trace, t.held_ids)  # trace ids: a deep copy's hooks have their own
