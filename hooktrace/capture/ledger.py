"""Every patch a capture makes, in one place: (owner, name, original), undone in reverse order.

The capture replaces attributes of torch (the `register_*` functions, `nn.Module`'s hook-reading
methods and `__call__`, the optimizer's, autograd's `_register_hook`, `saved_tensors_hooks.__enter__`,
`torch.distributed._register_comm_hook`), swaps the `__code__` of functions (the optimizers' step
wrappers, DDP comm hooks) and points its own patched functions at the capture that is open (the slots
of `CURRENT`). Each such change goes through one `Ledger`, which records what stood there before and
puts it back, last change first, so nested patches of one attribute unwind correctly. A ledger holds
what it restores and nothing else; after `restore()` it is empty and can be used again.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

_ABSENT = object()  # the owner had no attribute of its own by that name: restoring deletes it
_CALL = object()  # the name of an `on_restore` entry: its owner is called


class Current:
    """What the patched functions report to while a capture is open; None: they pass straight through.

    session: the open capture (`core.Capture`). interceptor: the `registry.Interceptor` that
    `register_*` calls report to. callbacks: the capture (or the registration watch before `exec`'s
    window) that autograd-node, saved-tensor and DDP comm registrations report to. viewer,
    on_output, run_compiled: the capture's views of the hook dicts and module-call callbacks
    (capture/views.py). on_step_end: the end of an outermost `optimizer.step()` (capture/steps.py).
    graph_runs: what records each run of a graph torch.compile made (capture/compiled.py).
    on_capture: told `(capture, opening)` as any capture opens and after it closed (`announce`):
    `hooktrace exec`'s window steps aside for a script's own `hooktrace.trace()`.
    Only a `Ledger` sets them, so they are restored with the patches; `Ledger.claim` refuses a slot
    another capture holds."""

    __slots__ = (
        "session",
        "interceptor",
        "callbacks",
        "viewer",
        "on_output",
        "run_compiled",
        "on_step_end",
        "graph_runs",
        "around_backward",
        "on_capture",
    )

    def __init__(self) -> None:
        self.session: Any = None  # the capture of the `hooktrace.trace()` session that is open
        self.interceptor: Any = None
        self.callbacks: Any = None
        self.viewer: Any = None
        self.on_output: Optional[Callable[[Any, Any], None]] = None
        self.run_compiled: Optional[Callable[..., Any]] = None
        self.on_step_end: Optional[Callable[[], None]] = None
        self.graph_runs: Optional[Callable[..., Any]] = None  # compiled.Runs.run
        self.around_backward: Optional[Callable[..., Any]] = None  # compiled.Installed.around_backward
        self.on_capture: Optional[Callable[[Any, bool], None]] = None


def announce(capture: Any, opening: bool) -> None:
    """A capture is about to open (`opening`) or has closed: tell whoever listens (runs/script.py)."""
    listener = CURRENT.on_capture
    if listener is not None:
        listener(capture, opening)


CURRENT = Current()


class Ledger:
    """Patches in the order they were made; `restore()` undoes them, the last one first."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        # (owner, name, original); owner a dict for `set_item`, a callable with name _CALL for `on_restore`
        self._entries: list[tuple[Any, Any, Any]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        """`owner.name = value`. For a class, the original is the class's own attribute (from its
        `__dict__`, a staticmethod or property as it stands there), not one it inherits."""
        if isinstance(owner, type):
            original = vars(owner).get(name, _ABSENT)
        else:
            original = getattr(owner, name, _ABSENT)
        self._entries.append((owner, name, original))
        setattr(owner, name, value)

    def swap_code(self, function: Any, code: Any) -> None:
        """`function.__code__ = code` (the function object stays: references to it see the new code)."""
        self.set(function, "__code__", code)

    def set_item(self, mapping: dict, key: Any, value: Any) -> None:
        """`mapping[key] = value` (a namespace the capture's copied code reads its names from)."""
        self._entries.append((mapping, key, mapping.get(key, _ABSENT)))
        mapping[key] = value

    def claim(self, name: str, value: Any, what: str) -> None:
        """Set the slot `name` of CURRENT, which no other capture may hold: RuntimeError if one does."""
        if getattr(CURRENT, name) is not None:
            raise RuntimeError(f"another capture's {what} are installed")
        self.set(CURRENT, name, value)

    def on_restore(self, undo: Callable[[], None]) -> None:
        """Call `undo()` when the restore reaches this point (state of the capture's own to clear)."""
        self._entries.append((undo, _CALL, None))

    def mark(self) -> int:
        """The position to `restore(to=...)`: what was recorded after it is undone, not what came before."""
        return len(self._entries)

    def restore(self, to: int = 0) -> None:
        """Undo every patch recorded after position `to`, the last first. An undo that raises does not
        stop the others; the first error is raised after all of them ran."""
        error: Optional[BaseException] = None
        entries = self._entries
        while len(entries) > to:
            owner, name, original = entries.pop()
            try:
                if name is _CALL:
                    owner()
                elif isinstance(owner, dict):
                    if original is _ABSENT:
                        owner.pop(name, None)
                    else:
                        owner[name] = original
                elif original is _ABSENT:
                    delattr(owner, name)
                else:
                    setattr(owner, name, original)
            except BaseException as exc:  # noqa: BLE001 - the rest is restored first
                error = error or exc
        if error is not None:
            raise error

    def patched(self) -> list[tuple[Any, Any, Any]]:
        """(owner, name, original) of every attribute and item patched now, oldest first."""
        return [(o, n, v) for o, n, v in self._entries if n is not _CALL]

    def __len__(self) -> int:
        return len(self._entries)
