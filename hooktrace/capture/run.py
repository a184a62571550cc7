"""Drive a run: call the factory inside the capture, then forward (+ loss + backward) for N steps.

Also the hook inventory for `hooktrace hooks`: the factory is called inside a capture, nothing runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from ..schema import Event, Hook, Trace, is_internal_error
from ..target import (
    Factory,
    Prepared,
    UsageError,
    coerce_result,
    compute_loss,
    parse_shape,
    prepare,
    resolve_device,
    torch_dtype,
)
from .dicts import live_hook_ids


@dataclass
class RunResult:
    """What a run gives back: the (possibly partial) trace, an error message if it raised, and notes."""

    trace: Trace
    error: Optional[str] = None
    exception: Optional[BaseException] = None
    notes: list[str] = field(default_factory=list)


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


def run(
    factory: Factory,
    *,
    steps: int = 1,
    backward: bool = True,
    input_shapes: Sequence[str] = (),
    dtype: Optional[str] = None,
    device: Optional[str] = None,
    on_step: Optional[Callable[[int], None]] = None,
) -> RunResult:
    """Load, run and trace. UsageError for bad input; an exception from the model is caught and reported.

    `on_step(step)` is called as each step starts (`run --nproc` reports the ranks' progress with it).
    """
    import hooktrace

    if steps < 1:
        raise UsageError(f"--steps {steps}: give at least 1")
    # bad options fail before the factory runs (it may be slow: process groups, big models)
    resolve_device(device)
    for shape in input_shapes:
        parse_shape(shape)
    if dtype is not None:
        torch_dtype(dtype)
    notes: list[str] = []
    exception: Optional[BaseException] = None
    with hooktrace.trace(target=factory.spec) as t:
        target = coerce_result(_call_factory(factory), factory.label)
        t.attach(target.model)
        prepared = prepare(target, input_shapes=input_shapes, dtype=dtype, device=device)
        t.set_meta(device=str(prepared.device), target=factory.spec, steps=steps)
        try:
            for step in range(steps):
                if step:
                    t.mark_step()
                if on_step is not None:
                    on_step(step)
                _step(prepared, backward, notes)
        except Exception as exc:  # the model or a hook raised: keep the partial trace
            exception = exc
    trace = t.trace
    if not backward:
        notes.append("backward skipped (--no-backward)")
    error = describe_error(trace, exception) if exception is not None else None
    if exception is not None and input_shapes and _rejects_inputs(trace, exception):
        shapes = " ".join([f"--input {s}" for s in input_shapes] + ([f"--dtype {dtype}"] if dtype else []))
        raise UsageError(
            f"the model rejected {shapes}: {error}; give shapes (and --dtype) it accepts"
        ) from exception
    return RunResult(trace=trace, error=error, exception=exception, notes=notes)


_INPUT_WORDS = (
    "shape",
    "size",
    "dimension",
    "dtype",
    "mat1",
    "must match",
    "expected input",
    "expected scalar",
)


def _rejects_inputs(trace: Trace, exception: BaseException) -> bool:
    """The generated inputs did not fit: a shape/dtype error from a module (not a hook) in step 0's forward."""
    event = failing_event(trace, exception)
    if event is None or event.type != "exit" or event.step != 0 or event.phase != "forward":
        return False
    text = str(exception).lower()
    return isinstance(exception, (RuntimeError, ValueError, TypeError, IndexError)) and any(
        word in text for word in _INPUT_WORDS
    )


def _step(prepared: Prepared, backward: bool, notes: list[str]) -> None:
    output = prepared.model(*prepared.inputs.args, **prepared.inputs.kwargs)
    if not backward:
        return
    loss = compute_loss(output, prepared.loss)
    if loss is None:
        note = "backward skipped: nothing in the output requires grad"
        if prepared.loss is not None:
            note = "backward skipped: loss(output) is not a tensor that requires grad"
        if note not in notes:
            notes.append(note)
        return
    loss.backward()


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
        return (
            f"{scope}{event.kind} hook {name} raised {error} in {event.phase} of "
            f"{_module_words(event.module)} (event #{event.seq}, step {event.step})"
        )
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
    import hooktrace

    with hooktrace.trace(target=factory.spec) as t:
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
