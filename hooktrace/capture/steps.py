"""Where a step of a user's script ends (`hooktrace exec --step-on`), and registrations seen before
the trace window opens.

- `optimizer`: at the return of each outermost `optimizer.step()` on its thread, of any optimizer
  (the step wrapper of every optimizer class is the capture's copy for the whole script, see
  capture/optim.py; its hook-dict reads pass straight through while no capture is open);
- `backward`: at the return of each outermost `torch.autograd.backward` (which `Tensor.backward`
  calls) on its thread;
- `forward`: at the return of each outermost module call on its thread, outside autograd's backward
  (a checkpoint's recompute is not a new forward). This one counts module calls: before the window it
  is the only per-call cost of `exec`.

A step that raises does not end. The watchers live in capture/ because they patch torch and because
frames here are plumbing to `sites.call_sites` (a registration under `loss.backward()` is the user's
line's, not hooktrace's).
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any, Callable

import torch
import torch.autograd

from ..options import STEP_BACKWARD, STEP_FORWARD, STEP_ON, STEP_OPTIMIZER
from . import autograd, dicts, fsdp, optim, registry, shims, sites
from .ledger import CURRENT, Ledger
from .records import Site
from .views import _is_compiling

_TENSOR_KINDS = frozenset(kind for _, kind in dicts.TENSOR_DICTS)


class StepWatch:
    """Calls `on_step_end()` at the end of each step, as `step_on` defines it; `restore()` undoes it."""

    def __init__(self, step_on: str, on_step_end: Callable[[], None]) -> None:
        if step_on not in STEP_ON:
            raise ValueError(f"step_on must be one of {STEP_ON}")
        self.step_on = step_on
        self._on_step_end = on_step_end
        self._ledger = Ledger()
        self._inner: list[Any] = []  # forward: what the counting `__call__` calls
        self._own_call: Any = None  # forward: PyTorch's `__call__`, under the counting one
        self._counting: Any = None

    def install(self) -> None:
        ledger = self._ledger
        if self.step_on == STEP_OPTIMIZER:
            ledger.set(CURRENT, "on_step_end", self._on_step_end)
            optim.install(ledger)
        elif self.step_on == STEP_BACKWARD:
            counting = self._counting_backward(torch.autograd.backward)
            ledger.set(torch.autograd, "backward", counting)  # not a kind: torch.autograd.backward
        else:
            self._own_call = vars(torch.nn.Module)["__call__"]
            self._inner[:] = [self._own_call]
            ledger.set(torch.nn.Module, "__call__", self._counting_call(self._own_call))

    def rewrap(self) -> None:
        """forward: count around whatever `nn.Module.__call__` is now (a capture's wrapper when the
        window has just opened, PyTorch's own when it has just closed)."""
        if self.step_on != STEP_FORWARD or not len(self._ledger):
            return
        current = vars(torch.nn.Module)["__call__"]
        if current is self._counting:  # the window closed: the capture put the counter back
            self._inner[0] = self._own_call
        else:  # the window opened: count around the capture's wrapper until it closes
            self._inner[0] = current
            # the counter again, over the capture's patch: the capture's ledger puts it back when the
            # window closes, this one PyTorch's own at the end
            self._ledger.set(torch.nn.Module, "__call__", self._counting)

    def restore(self) -> None:
        self._ledger.restore()

    def on_backward(self, begins: Callable[[], None]) -> None:
        """`begins()` as each `torch.autograd.backward` (`Tensor.backward`) begins, until `restore()`:
        exec's window opened at a forward's end sees the backward of that forward run inside it."""
        original = torch.autograd.backward

        def backward(*args: Any, **kwargs: Any) -> Any:
            begins()
            return original(*args, **kwargs)

        backward.__wrapped__ = original  # type: ignore[attr-defined]
        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            setattr(backward, attr, getattr(original, attr))
        self._ledger.set(torch.autograd, "backward", backward)  # not a kind: torch.autograd.backward

    def _counting_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        depth: dict[int, int] = {}
        on_step_end = self._on_step_end

        def backward(*args: Any, **kwargs: Any) -> Any:
            tid = threading.get_ident()
            level = depth.get(tid, 0)
            depth[tid] = level + 1
            try:
                result = original(*args, **kwargs)
            finally:
                depth[tid] = level
            if level == 0:
                on_step_end()
            return result

        backward.__wrapped__ = original  # type: ignore[attr-defined]
        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            setattr(backward, attr, getattr(original, attr))
        return backward

    def _counting_call(self, original: Callable[..., Any]) -> Callable[..., Any]:
        depth: dict[int, int] = {}
        inner = self._inner
        on_step_end = self._on_step_end
        compiling = _is_compiling

        def hooktrace_counted_call(module: Any, *args: Any, **kwargs: Any) -> Any:
            if compiling():
                return original(module, *args, **kwargs)
            tid = threading.get_ident()
            level = depth.get(tid, 0)
            depth[tid] = level + 1
            try:
                result = inner[0](module, *args, **kwargs)
            finally:
                depth[tid] = level
            if level == 0 and not shims.in_backward():
                on_step_end()
            return result

        hooktrace_counted_call.hooktrace_counting = True  # type: ignore[attr-defined]
        hooktrace_counted_call.__name__ = original.__name__
        hooktrace_counted_call.__qualname__ = original.__qualname__
        hooktrace_counted_call.__wrapped__ = original  # type: ignore[attr-defined]
        self._counting = hooktrace_counted_call
        return hooktrace_counted_call


class Registrations:
    """Hook registrations before the window opens: where each was made (call sites, `prepend`), and
    the tensors that got hooks (their hooks are traced once the window opens). Only registration
    costs anything; nothing is wrapped. `pause()` while a capture is open (it sees them itself).

    `during_run()`: whether a registration happens while the model runs (a capture knows it from its
    wrappers; here nothing is wrapped, so the driver says it; default: inside autograd's backward)."""

    def __init__(self, during_run: Callable[[], bool] = shims.in_backward) -> None:
        self.sites: dict[int, Site] = {}
        self.removed: set[int] = set()  # handle ids of hooks registered here and removed since
        self._during_run = during_run
        self.tensors: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self._interceptor = registry.Interceptor(self._on_register, self._on_handle, self._on_remove)
        self._ledger = Ledger()
        self.comm_hooks: list[tuple[Any, Any, Site]] = []  # (weakref to the DDP module, hook, site)
        # autograd nodes that got hooks (an AccumulateGrad's outlive a step): id(dict) -> (weakref
        # to the node's hook dict, kind, weakref to the node's variable or None)
        self.node_dicts: dict[int, tuple[Any, str, Any]] = {}
        # FSDP hooks set here: (kind, id(module), id(hook)) -> (weakrefs to the hook and the module,
        # site: nothing of the user's is kept alive); FSDP's setters are watched once it is imported
        # and a module registers a hook (fully_shard does)
        self.fsdp_sites: dict[tuple[str, int, int], tuple[Any, Any, Site]] = {}
        self._fsdp_watched: set[str] = set()
        self._fsdp_pending = True

    def install(self) -> None:
        ledger = self._ledger
        if len(ledger):  # installed already
            return
        try:
            self._interceptor.install(ledger)
            dist = getattr(torch, "distributed", None)
            original = getattr(dist, "_register_comm_hook", None) if dist is not None else None
            if dist is not None and original is not None:
                ledger.set(dist, "_register_comm_hook", self._comm_patch(original))
            autograd.watch_node_hooks(self, ledger)
            self._fsdp_pending = fsdp.watch_before(ledger, self._fsdp_watched, self._on_fsdp_set)
        except BaseException:
            self.pause()
            raise

    def pause(self) -> None:
        self._ledger.restore()
        self._fsdp_watched.clear()
        self._fsdp_pending = True

    def _on_fsdp_set(self, kind: str, module: Any, hook: Any, frame: Any) -> None:
        if _is_compiling():
            return
        try:
            refs = weakref.ref(hook), weakref.ref(module)
        except TypeError:
            return  # no weak reference to it: no call site
        found = self.fsdp_sites
        if len(found) >= 1024:  # a script setting new hooks every step: forget the dead ones
            for key in [k for k, (h, m, _s) in found.items() if h() is None or m() is None]:
                del found[key]
        found[(kind, id(module), id(hook))] = (*refs, self._site(frame))

    def on_node_hook(self, d: dict, handle: Any, kind: str, node: Any, frame: Any) -> None:
        """A hook registered on an autograd node (capture/autograd.py calls this): where, and the
        node's dict, whose hooks are traced once the window opens if the node is still alive."""
        self.sites[handle.id] = self._site(frame)
        variable = getattr(node, "variable", None) if node is not None else None
        try:
            ref = weakref.ref(d)
        except TypeError:
            return
        self.node_dicts[id(d)] = (ref, kind, weakref.ref(variable) if variable is not None else None)

    def _comm_patch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """DDP communication hooks registered before the window: the reducer gets the user's hook as
        it is; the hook, its DDP module and where it was registered are remembered, and traced
        through its code while the window is open (capture/comm.py)."""
        site_of = self._site
        found = self.comm_hooks

        def _register_comm_hook(reducer: Any, state: Any, hook: Any) -> Any:
            result = original(reducer, state, hook)
            if not _is_compiling() and callable(hook):
                ddp, frame = autograd.ddp_and_caller(sys._getframe(1))
                found.append((weakref.ref(ddp) if ddp is not None else (lambda: None), hook, site_of(frame)))
            return result

        return _register_comm_hook

    restore = pause

    def _site(self, frame: Any, prepend: bool = False) -> Site:
        at, by = sites.call_sites(frame)
        return Site(at, by, self._during_run(), prepend)

    def _on_register(self, handle: Any, kind: str, owner: Any, arguments: dict, frame: Any) -> None:
        self.sites[handle.id] = self._site(frame, bool(arguments.get("prepend", False)))
        if self._fsdp_pending and isinstance(owner, torch.nn.Module):  # FSDP imported since?
            self._fsdp_pending = fsdp.watch_before(self._ledger, self._fsdp_watched, self._on_fsdp_set)
        if kind in _TENSOR_KINDS and isinstance(owner, torch.Tensor):
            try:
                self.tensors[id(owner)] = owner
            except TypeError:
                pass

    def _on_handle(self, handle: Any, frame: Any) -> None:
        if sites._frame_class(frame.f_code.co_filename) == sites.PLUMBING:
            return  # BackwardHook's node hooks, made at each call of a module with backward hooks
        self.sites.setdefault(handle.id, self._site(frame))

    def _on_remove(self, handle: Any) -> None:
        if handle.id in self.sites:
            self.removed.add(handle.id)


def open_after(registrations: Registrations, session: Any) -> None:
    """Open `session` (a TraceSession) where `registrations` leaves off: it gets their call sites,
    the tensors that got hooks and the DDP comm hooks, and sees registrations itself from now on.
    `hooktrace exec` at its window and `hooktrace run --warmup` after the warm-up steps."""
    registrations.pause()
    session.known_sites(dict(registrations.sites), dict(registrations.fsdp_sites))
    session.__enter__()
    capture = session._capture  # what the session's capture takes over, not the public session's
    try:
        for tensor in list(registrations.tensors.values()):
            capture.adopt_tensor(tensor)
        for ddp, hook, site in registrations.comm_hooks:
            capture.comm_hook_at(ddp(), hook, site)
        for ref, kind, variable in list(registrations.node_dicts.values()):
            d = ref()
            if d:
                capture.adopt_node_hooks(d, kind, variable() if variable is not None else None)
    except BaseException:
        session.__exit__(None, None, None)  # every dict restored; the caller sees it as not opened
        raise
