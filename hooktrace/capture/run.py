"""Drive a run: call the factory inside the capture, then forward, backward and the optimizer step
for N steps; stop cleanly on SIGINT / SIGTERM.

Also the hook inventory for `hooktrace hooks`: the factory is called inside a capture, nothing runs.
"""

from __future__ import annotations

import re
import signal
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..inputs import Prepared, coerce_result, compute_loss, prepare, resolve_device
from ..options import RunOptions, UsageError
from ..schema import Event, Hook, Trace, is_internal_error
from ..target import Factory
from .dicts import live_hook_ids
from .session import TraceSession


@dataclass
class RunResult:
    """What a run gives back: the (possibly partial) trace, an error message if it raised, and notes.

    `stopped_by`: the signal (SIGINT, SIGTERM) that ended the run early, if one did."""

    trace: Trace
    error: Optional[str] = None
    exception: Optional[BaseException] = None
    notes: list[str] = field(default_factory=list)
    stopped_by: Optional[signal.Signals] = None


class Stopped(BaseException):
    """Raised in the run by SIGINT / SIGTERM: like KeyboardInterrupt, not an error of the model."""

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum)
        super().__init__(f"{self.signal.name} (the run was stopped)")


class _StopSignals:
    """SIGINT and SIGTERM raise `Stopped` while `armed` (the factory and the steps run); otherwise,
    e.g. while the capture restores the hook dicts, they are only remembered in `pending`."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.armed = False
        self.pending: Optional[int] = None
        self._saved: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.armed:
            self.armed = False
            raise Stopped(signum)
        if self.pending is None:
            self.pending = signum

    def __enter__(self) -> _StopSignals:
        if self.enabled:
            for sig in self.SIGNALS:
                self._saved[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in self._saved.items():
            signal.signal(sig, previous)


def _call_factory(factory: Factory) -> Any:
    try:
        return factory()
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(
            f"the factory {factory.label} raised {type(exc).__name__}: {exc}; "
            "fix it (--traceback shows where)"
        ) from exc
    except SystemExit as exc:
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
    """Where the steps are: which step, and which part of it (forward, loss, backward, optimizer)."""

    step: int = 0
    stage: str = "setup"


def run(
    factory: Factory,
    options: RunOptions = RunOptions(),
    *,
    stop_signals: bool = False,
    on_step: Optional[Callable[[int], None]] = None,
) -> RunResult:
    """Load, run and trace. UsageError for bad input; an exception from the model is caught and reported.

    `on_step(step)` is called as each step starts (`run --nproc` reports the ranks' progress with it).

    stop_signals: SIGINT/SIGTERM (main thread only) stop the run; the partial trace is returned with
    `stopped_by` set. The rank worker, which handles signals itself, leaves this off."""
    options.check()
    resolve_device(options.device)  # CUDA absent: say so before the (maybe slow) factory runs
    notes: list[str] = []
    exception: Optional[BaseException] = None
    stopped: Optional[int] = None
    progress = _Progress()
    with factory.on_sys_path(), _StopSignals(stop_signals) as signals:
        with TraceSession(target=factory.spec) as t:
            signals.armed = True
            try:
                target = coerce_result(_call_factory(factory), factory.label)
                t.attach(target.model)
                prepared = prepare(target, options)
                notes += prepared.notes
                t.set_meta(device=str(prepared.device), target=factory.spec, steps=options.steps)
                for step in range(options.steps):
                    if step:
                        t.mark_step()
                    progress.step = step
                    if on_step is not None:
                        on_step(step)
                    _step(prepared, options.backward, notes, progress)
            except Stopped as exc:
                stopped = exc.signal
            except KeyboardInterrupt:  # SIGINT with Python's own handler (stop_signals off)
                stopped = signal.SIGINT
            except UsageError:
                raise
            except BaseException as exc:  # the model or a hook raised (sys.exit too): keep the partial trace
                exception = exc
            finally:
                signals.armed = False
        stopped = stopped or signals.pending
    trace = t.trace
    if not options.backward:
        notes.append("backward skipped (--no-backward)")
    error = describe_error(trace, exception) if exception is not None else None
    if exception is not None and prepared_inputs_rejected(trace, exception, progress, options):
        raise UsageError(_rejected_message(trace, exception, error or "", options, prepared)) from exception
    return RunResult(
        trace=trace,
        error=error,
        exception=exception,
        notes=notes,
        stopped_by=signal.Signals(stopped) if stopped is not None else None,
    )


def prepared_inputs_rejected(
    trace: Trace, exception: BaseException, progress: _Progress, options: RunOptions
) -> bool:
    """The generated `--input` tensors did not fit: the exception came out of the model's own code
    (not a hook) during the first forward call. Decided by where it was raised, not by its words."""
    if not options.input_shapes or progress.step != 0 or progress.stage != "forward":
        return False
    if not isinstance(exception, Exception):
        return False
    event = failing_event(trace, exception)
    return event is None or event.type != "hook"


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
    if floating and kind in ("Embedding", "EmbeddingBag"):
        hint = f"{kind} takes indices: add --dtype int64"
    elif not floating and any(p.is_floating_point() for p in prepared.model.parameters()):
        hint = "give a floating --dtype (e.g. --dtype float32) unless it takes indices, or another shape"
    elif floating and any(not p.is_floating_point() for p in prepared.model.parameters()):
        hint = "give the shape it expects, or --dtype int64 if it takes indices"
    else:
        hint = "give the shape it expects (or --dtype int64 if it takes indices)"
    return f"the model rejected {given}: {error}; {hint}"


def _step(prepared: Prepared, backward: bool, notes: list[str], progress: _Progress) -> None:
    progress.stage = "forward"
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
    progress.stage = "backward"
    loss.backward()
    if prepared.optimizer is not None:
        progress.stage = "optimizer"
        prepared.optimizer.step()
        prepared.optimizer.zero_grad()


# -- naming the failure -----------------------------------------------------------------------------


def _module_words(path: Optional[str]) -> str:
    if path is None:
        return "outside any module"
    return "the root module" if path == "" else f"module '{path}'"


def failing_event(trace: Trace, exception: Optional[BaseException] = None) -> Optional[Event]:
    """The event where the run failed: the first hook that raised, else the innermost module exit.

    Events whose error matches the exception that ended the run are preferred, so an exception the
    model raised and caught itself earlier does not take the blame.
    """
    errored = [e for e in trace.events if e.error and not (e.type == "exit" and is_internal_error(e.error))]
    if exception is not None:
        text = f"{type(exception).__name__}: {exception}"
        matching = [e for e in errored if e.error == text]
        errored = matching or errored
    for e in errored:
        if e.type in ("hook", "exit"):
            return e
    return None


def describe_error(trace: Trace, exception: Optional[BaseException]) -> str:
    """One line naming the module path, the hook (if any) and the exception."""
    exc_text = f"{type(exception).__name__}: {exception}" if exception is not None else None
    event = failing_event(trace, exception)
    if event is None:
        return f"the run raised {exc_text} outside any traced module or hook"
    error = exc_text or event.error
    if event.type == "hook" and event.hook is not None:
        try:
            hook: Optional[Hook] = trace.hook(event.hook)
        except KeyError:
            hook = None
        name = hook.name if hook else f"#{event.hook}"
        scope = f"{hook.scope} " if hook and hook.scope != "module" else ""
        of = f" of {_module_words(event.module)}" if event.module is not None else ""
        return f"{scope}{event.kind} hook {name} raised {error} in {event.phase}{of} (event #{event.seq}, step {event.step})"
    where = f"(event #{event.seq}, step {event.step})"
    return f"{_module_words(event.module)} raised {error} in {event.phase} {where}"


# -- inventory (`hooktrace hooks`) ----------------------------------------------------------------


@dataclass
class InventoryRow:
    """The hooks of one kind that fire for one module (or one tensor), in firing order."""

    module: str
    kind: str
    hooks: list[Hook]
    tensor: Optional[str] = None


@dataclass
class Inventory:
    """The hooks a factory left registered: its trace, and the ids still in PyTorch's dicts."""

    trace: Trace
    live: set[int]


def inventory(factory: Factory) -> Inventory:
    """Call the factory inside a capture, without running the model; the trace holds every hook."""
    with TraceSession(target=factory.spec) as t:
        target = coerce_result(_call_factory(factory), factory.label)
        t.attach(target.model)
        t.set_meta(target=factory.spec, steps=0)
    return Inventory(t.trace, live_hook_ids(target.model))


def firing_order(trace: Trace, live: Optional[set[int]] = None) -> list[InventoryRow]:
    """Per module (named_modules order), per kind: global hooks first, then the module's dict order.

    Global hooks fire for every module; they are listed with the modules that have hooks of their own
    of that kind. Tensor hooks on parameters follow their module's rows, one row per tensor and kind.
    `live`: ids still registered (hooks the factory registered and removed again are left out).
    """
    from ..schema import KINDS

    hooks_now = [h for h in trace.hooks if (h.id in live if live is not None else not h.removed_during_run)]
    globals_by_kind: dict[str, list[Hook]] = {}
    for h in hooks_now:
        if h.scope == "global":
            globals_by_kind.setdefault(h.kind, []).append(h)
    rows: list[InventoryRow] = []
    paths = [m.path for m in trace.modules]
    paths += sorted({h.module for h in hooks_now if h.module is not None and h.module not in set(paths)})
    for path in paths:
        own = [h for h in hooks_now if h.module == path and h.scope == "module"]
        for kind in KINDS:
            mine = [h for h in own if h.kind == kind]
            if mine:
                rows.append(InventoryRow(path, kind, globals_by_kind.get(kind, []) + mine))
        tensors: dict[tuple[str, str], list[Hook]] = {}
        for h in hooks_now:
            if h.scope == "tensor" and h.module == path:
                tensors.setdefault((h.tensor or "?", h.kind), []).append(h)
        for (tensor, kind), hooks in tensors.items():
            rows.append(InventoryRow(path, kind, hooks, tensor=tensor))
    return rows


@dataclass
class ModuleHooks:
    """One module's rows, and the other modules (e.g. layers 1..11) whose hooks are the same."""

    module: str
    rows: list[InventoryRow]
    same: list[str] = field(default_factory=list)


def _numbered(path: str) -> str:
    return re.sub(r"(?:(?<=\.)|^)\d+(?=\.|$)", "#", path)


def _hook_key(h: Hook) -> tuple:
    return (h.name, h.kind, h.scope, h.prepend, h.prepend_source, h.with_kwargs, h.always_call,
            h.defined_at, h.registered_at, h.registered_by)  # fmt: skip


def group_modules(rows: list[InventoryRow], collapse: bool = True) -> list[ModuleHooks]:
    """Rows per module; with `collapse`, modules whose path differs only in numbers (layers.0, layers.1)
    and whose hooks are the same are folded into the first one."""
    per_module: dict[str, list[InventoryRow]] = {}
    for row in rows:
        per_module.setdefault(row.module, []).append(row)
    groups: list[ModuleHooks] = []
    seen: dict[tuple, ModuleHooks] = {}
    for path, mine in per_module.items():
        prefix = f"{path}." if path else ""
        key = (
            _numbered(path),
            tuple(
                (r.kind, (r.tensor or "").removeprefix(prefix), tuple(_hook_key(h) for h in r.hooks))
                for r in mine
            ),
        )
        if collapse and key in seen:
            seen[key].same.append(path)
            continue
        group = ModuleHooks(path, mine)
        seen[key] = group
        groups.append(group)
    return groups
