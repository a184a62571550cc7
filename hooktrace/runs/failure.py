"""Naming where a traced run failed: the module path, the hook (if any) and the exception."""

from __future__ import annotations

from typing import Optional

from ..kinds import EXIT, HOOK, MODULE
from ..schema import Event, Hook, Trace, is_internal_error


def _module_words(path: Optional[str]) -> str:
    if path is None:
        return "outside any module"
    return "the root module" if path == "" else f"module '{path}'"


def failing_event(trace: Trace, exception: Optional[BaseException] = None) -> Optional[Event]:
    """The event where the run failed: the first hook that raised, else the innermost module exit.

    Events whose error matches the exception that ended the run are preferred, so an exception the
    model raised and caught itself earlier does not take the blame.
    """
    errored = [e for e in trace.events if e.error and not (e.type == EXIT and is_internal_error(e.error))]
    if exception is not None:
        text = f"{type(exception).__name__}: {exception}"
        matching = [e for e in errored if e.error == text]
        errored = matching or errored
    for e in errored:
        if e.type in (HOOK, EXIT):
            return e
    return None


def describe_error(trace: Trace, exception: Optional[BaseException]) -> str:
    """One line naming the module path, the hook (if any) and the exception."""
    exc_text = f"{type(exception).__name__}: {exception}" if exception is not None else None
    event = failing_event(trace, exception)
    if event is None:
        return f"the run raised {exc_text} outside any traced module or hook"
    error = exc_text or event.error
    if event.type == HOOK and event.hook is not None:
        try:
            hook: Optional[Hook] = trace.hook(event.hook)
        except KeyError:
            hook = None
        name = hook.name if hook else f"#{event.hook}"
        scope = f"{hook.scope} " if hook and hook.scope != MODULE else ""
        of = f" of {_module_words(event.module)}" if event.module is not None else ""
        return f"{scope}{event.kind} hook {name} raised {error} in {event.phase}{of} (event #{event.seq}, step {event.step})"
    where = f"(event #{event.seq}, step {event.step})"
    return f"{_module_words(event.module)} raised {error} in {event.phase} {where}"
