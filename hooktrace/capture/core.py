"""The capture behind `hooktrace.trace()`: installs the patches (one ledger), receives every
registration and hook callback, restores everything at the end of the block and leaves `pending`,
what the trace is built from.

Where hooks live is `dicts`, how module and global hooks are seen without touching their dicts
`views`, records and shims `records`, tensor naming `tensors`, the walk over every dict at the end
`ending`, and the trace is built from records by `build`. The public face is session.py's
`TraceSession`.
"""

from __future__ import annotations

import datetime as _dt
import sys
import threading
import time
import warnings
from types import FrameType
from typing import Any, Optional

import torch
from torch.utils.hooks import RemovableHandle

from ..io import gc_paused
from ..kinds import INPUT_OF, NODE, K
from ..schema import Meta
from . import (
    autograd,
    build,
    comm,
    compiled,
    dicts,
    dynamo,
    ending,
    fsdp,
    hookapis,
    kept,
    modulecall,
    optim,
    registry,
    roots,
    shims,
    sites,
    views,
)
from .ledger import CURRENT, Ledger, announce
from .records import HookBook, Site
from .tensors import TensorNamer, dtype_and_device

_TENSOR_KINDS = frozenset(kind for _, kind in dicts.TENSOR_DICTS)


def _no_path(_module: Any) -> None:
    return None


class Capture:
    """The capture behind a `TraceSession`: installs the patches (one ledger), receives every
    registration and hook callback (`registry`, `autograd`, the views), and leaves `pending`, what the
    trace is built from. Only `TraceSession` and `steps.open_after` use it."""

    def __init__(self, model: Any = None, *, target: Optional[str] = None, shapes: bool = False) -> None:
        self._model = model
        self._roots: list[Any] = []  # the model, or with no model the roots of the calls (ending.modules_of)
        self._meta = Meta(target=target)
        self.pending: Optional[build.Pending] = None  # what the trace is built from, after the block
        self._ran = False
        self.shapes = shapes
        self._rec = shims.Recorder(shapes)
        self._paths: dict[int, str] = {}
        self._book = HookBook(self._rec, self._path_of)
        self._kept = kept.Kept(self._rec)
        self._run_codes: set[Any] = set()
        self._namer = TensorNamer(self._run_codes, self._book.kind_and_owner, self._rec.who)
        # every patch of the block: registration patches first, then (from `_walk_mark`) the rest
        self._ledger = Ledger()
        self._walk_mark = 0
        self._module_call: Any = None
        self._compiled: Optional[compiled.Installed] = None
        self._graph_runs: Optional[compiled.Runs] = None
        self._forward_compiled: Optional[compiled.Forward] = None
        self._lock = threading.Lock()  # registration callbacks on other threads vs. the end of the block
        self._active = False
        self._start_ns = 0
        self._held: set[int] = set()  # trace ids of the hooks the dicts held when the block ended

    # -- open / close ----------------------------------------------------------------------
    def open(self) -> None:
        announce(self, True)  # `hooktrace exec`'s window steps aside for a script's own trace()
        if CURRENT.session is not None:
            raise RuntimeError(
                "hooktrace.trace() is already active; nested or concurrent tracing is not supported. "
                "Finish the outer `with hooktrace.trace(...)` block first."
            )
        if self._ran:
            raise RuntimeError("this hooktrace.trace() session has already run; create a new one")
        self._ran = True
        if self._rec.step_starts:
            raise RuntimeError(
                "mark_step() was called before the `with hooktrace.trace(...)` block; call it inside"
            )
        self._ledger.set(CURRENT, "session", self)
        self._kept.bind(self._ledger)  # restored with the registration patches, after the final walk
        self._active = True
        self._meta.clock_unix_ns = time.time_ns()
        self._start_ns = self._meta.clock_perf_ns = time.perf_counter_ns()
        self._meta.created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        try:
            with gc_paused():
                self._install()
                if self._model is not None:
                    roots.record_held(
                        self._book, self._rec, self._paths, self._model, self.comm_hook, self._kept
                    )
        except BaseException:
            self._finish()
            raise

    def close(self) -> None:
        self._finish()

    @property
    def active(self) -> bool:
        return self._active

    def attach(self, model: Any) -> None:
        """Name module paths after `model` and record the hooks it already holds."""
        self._model = model
        if self._active:
            with gc_paused():
                roots.record_held(self._book, self._rec, self._paths, model, self.comm_hook, self._kept)

    def known_sites(self, found: dict[int, Site], fsdp_found: Optional[dict[Any, Any]] = None) -> None:
        """Call sites of hooks registered before this capture (`hooktrace exec` watches registrations
        from the script's first line): hooks with these handle ids get them, and FSDP's hooks in
        `fsdp_found` (capture/steps.py `Registrations.fsdp_sites`). Before the block."""
        self._book.sites.update(found)
        if fsdp_found:
            self._book.fsdp_sites.update(fsdp_found)

    def adopt_tensor(self, tensor: Any) -> None:
        """Trace the hooks a tensor got before the block (as for a module's input, `_on_input`)."""
        with self._lock:
            if not self._active:
                return
            for hd in dicts.tensor_dicts(tensor):
                for hid in list(hd.d or ()):
                    self._book.wrap_tensor_hook(hd.d, hid, hd.kind, tensor)
                if hd.d:
                    self._book.infer_prepends(hd.d)

    def adopt_node_hooks(self, d: dict, kind: str, variable: Any) -> None:
        """Trace the hooks an autograd node's dict got before the block (`variable`: an AccumulateGrad's)."""
        with self._lock:
            for hid, fn in list(d.items()) if self._active else ():
                if not sites.is_plumbing_hook(fn):
                    self._book.wrap_tensor_hook(d, hid, kind, variable, scope=NODE)

    def live_roots(self) -> list[Any]:
        """With no model: the live modules of the outermost calls so far. A driver holds them while
        the capture is open, so their names outlive a script that ends inside it."""
        return roots.of_calls(self._rec) if self._model is None else []

    def mark_step(self) -> None:
        """Start the next step: later events carry `step + 1`."""
        if not self._active:
            raise RuntimeError("mark_step() works inside the `with hooktrace.trace(...)` block only")
        self._rec.mark_step()

    @property
    def held_ids(self) -> set[int]:
        """Trace ids of the hooks the model's and the global dicts held when the block ended (copies'
        hooks under their own ids), for listing what stays registered."""
        return set(self._held)

    # -- install / restore ---------------------------------------------------------------
    def _install(self) -> None:
        # once per process; later captures find nothing new
        dynamo.skip_own_frames(shims.SHIM_CODES | modulecall.CODES)
        ledger = self._ledger
        registry.Interceptor(self._on_register, self._on_handle, self._on_remove).install(ledger)
        self._walk_mark = ledger.mark()  # what follows is undone before the walk, the registrations after
        # the hooks Dynamo compiles into graphs: patched now if Dynamo is imported, else at the
        # first compiled module call (an eager capture never imports Dynamo)
        self._forward_compiled = compiled.Forward(self._rec, self._book.trace_id, ledger)
        module_call = modulecall.make_module_call(
            self._rec,
            vars(torch.nn.Module)["__call__"],
            views.call_impl_copy(),
            vars(torch.nn.Module)["_call_impl"],
            self._on_input,
            self._on_new_module,
            self._paths,
            on_compiled=self._forward_compiled.install,
        )
        self._run_codes.update((module_call.__code__, modulecall.SWAPPED_CODE))
        self._module_call = module_call
        views.install(self._book, module_call, self._namer.on_output, ledger)
        modulecall.install(module_call, ledger)
        optim.install(ledger)
        autograd.install(self, ledger)
        fsdp.install(self._book, self._site, self._lock, lambda: self._active, ledger)
        self._graph_runs = compiled.Runs(self._rec)
        ledger.claim("graph_runs", self._graph_runs.record_run, "compiled-graph runs")
        self._compiled = compiled.Installed(self._rec, ledger)
        if self._compiled.note is not None:
            warnings.warn(self._compiled.note, RuntimeWarning, stacklevel=3)
        hookapis.install(
            hookapis.Tracer(self._book, self._site, self._lock, lambda: self._active),
            ledger,
            watch_backward=self._compiled.watches_backward,
        )
        self._forward_compiled.install()

    def _finish(self) -> None:
        with gc_paused():
            final: Optional[ending.Final] = None
            try:
                with self._lock:
                    self._active = False
                # last patch first: comm hooks' own code (the reducer calls the user's hook as it is),
                # compiled autograd's, autograd's functions, the optimizers', nn.Module's
                self._ledger.restore(to=self._walk_mark)
                if self._module_call is not None:
                    modulecall.end(self._module_call)
                # the walk puts tensor hooks back: removals on other threads are still seen meanwhile
                named, self._roots = ending.modules_of(self._rec, self._model)
                final = ending.walk(self._book, self._rec, self._model, named)
            finally:
                self._ledger.restore()  # the registration patches, and this session's place
                announce(self, False)
                if final is None:  # the walk failed: at least no shim stays in a tensor's dict
                    for ref, _owner, scope in list(self._book.seen_dicts.values()):
                        d = ref()
                        if d is not None and scope in dicts.IN_PLACE_SCOPES:
                            self._book.unwrap(d)
            if final is not None:
                self._held = set(final.order)
            try:
                self.pending = ending.snapshot(
                    self._book, self._rec, self._meta, self._start_ns, self._paths, self._roots, final
                )
                if self._graph_runs is not None:
                    self.pending.graph_runs = self._graph_runs.runs
                if self._compiled is not None and self._compiled.unseen:
                    self.pending.unseen_backward = compiled.UNSEEN_GRAPH
                f = self._forward_compiled
                if f is not None:
                    self.pending.compiled_graphs = f.graphs if f.installed and f.note is None else None
            finally:
                self._release()

    # -- registration callbacks ----------------------------------------------------------
    def _during_run(self, frame: Optional[FrameType]) -> bool:
        if shims.in_backward():
            return True
        codes = self._run_codes
        while frame is not None:
            if frame.f_code in codes:
                return True
            frame = frame.f_back
        return False

    def _site(self, frame: Optional[FrameType]) -> Site:
        at, by = sites.call_sites(frame)
        return Site(at, by, self._during_run(frame))

    def _on_handle(self, handle: RemovableHandle, frame: FrameType) -> None:
        # Handles made by PyTorch's plumbing (BackwardHook's node hooks) are not hooks users see.
        if sites._frame_class(frame.f_code.co_filename) == 2:
            return
        self._book.sites[handle.id] = self._site(frame)

    def _on_remove(self, handle: RemovableHandle) -> None:
        d = handle.hooks_dict_ref()
        if d is None or handle.id not in d:
            return
        record = self._book.records.get(self._book.trace_id(d, handle.id))
        if record is None or record.removed:
            return
        record.removed = True
        if self._during_run(sys._getframe(1)):
            record.removed_during_run = True

    def _on_register(
        self, handle: RemovableHandle, kind: str, owner: Any, arguments: dict, frame: Any
    ) -> None:
        site = self._site(frame)
        site.prepend = bool(arguments.get("prepend", False))
        book = self._book
        book.sites[handle.id] = site
        d = handle.hooks_dict_ref()
        if d is None or handle.id not in d:
            return
        with self._lock:
            if not self._active:  # the block ended while this registration ran on another thread
                return
            if kind in _TENSOR_KINDS:
                record = book.wrap_tensor_hook(d, handle.id, kind, owner)
                if record is not None:
                    record.tensor_desc = self._namer.describe(owner, frame)
                return
            fsdp.on_module_hook(book)  # FSDP imported inside the block: patched once its modules register
        if kind == K.backward:
            kind = dicts.backward_kind(owner)
        # the record exists from now on, so a hook removed before it could fire is still in the trace
        fn = d.get(handle.id)
        if fn is None:  # removed meanwhile, on another thread
            return
        book.record(d, handle.id, fn, kind, owner, dicts.scope_of(owner))
        book.infer_prepends(d)

    def _on_input(self, module: Any, tensor: Any) -> None:
        """A module got a tensor whose hooks were registered before the block: trace them too."""
        with self._lock:
            if not self._active:
                return
            for hd in dicts.tensor_dicts(tensor):
                for hid in [*(hd.d or ())]:
                    record = self._book.wrap_tensor_hook(hd.d, hid, hd.kind, tensor)
                    if record is not None and record.tensor_desc is None:
                        record.tensor_desc = (INPUT_OF, self._rec.who(module))

    def _on_new_module(self, module: Any) -> None:
        """A module's first call in the block: hooks its parameters held before the block are traced
        too (the model's were at the start; this reaches modules outside it, and every module when
        `trace()` has no model)."""
        params = module.__dict__.get("_parameters")
        if not params:
            return
        with self._lock:
            if not self._active:
                return
            for param in list(params.values()):
                if param is None:
                    continue
                for hd in dicts.tensor_dicts(param):
                    if hd.d:
                        for hid in [*hd.d]:
                            self._book.wrap_tensor_hook(hd.d, hid, hd.kind, param)
                        self._book.infer_prepends(hd.d)

    # -- hooks held outside Python (capture/autograd.py) ---------------------------------
    def on_node_hook(self, d: dict, handle: RemovableHandle, kind: str, node: Any, frame: FrameType) -> None:
        """A hook registered on an autograd node: a shim stands in the node's dict for the block."""
        site = self._site(frame)
        with self._lock:
            if not self._active or handle.id not in d:
                return
            self._book.sites[handle.id] = site
            variable = getattr(node, "variable", None) if node is not None else None
            # the node's dict holds one kind: hooks registered on it before the block are traced now
            # too, but not PyTorch's own (a module's backward hooks' BackwardHook node hooks)
            placed = dtype_and_device(variable) if variable is not None else None
            for hid, fn in list(d.items()):
                if hid == handle.id or not sites.is_plumbing_hook(fn):
                    record = self._book.wrap_tensor_hook(d, hid, kind, variable, scope=NODE)
                    if record is not None and record.node_of is None:
                        record.node_of = placed  # a move to another dtype or device replaces the node

    def saved_tensors_shims(self, ctx: Any, frame: FrameType) -> tuple[Any, Any]:
        return self._book.saved_tensors_shims(ctx, self._site(frame))

    def comm_hook(self, ddp: Any, hook: Any, frame: Optional[FrameType]) -> None:
        """A DDP comm hook (registered now, or before the block): its calls are traced until the end."""
        self.comm_hook_at(ddp, hook, self._site(frame) if frame is not None else None)

    def comm_hook_at(self, ddp: Any, hook: Any, site: Optional[Site]) -> None:
        """A DDP comm hook registered before this capture, at `site` (`hooktrace exec` saw it)."""
        with self._lock:
            if self._active:
                comm.trace_hook(hook, lambda call: self._book.comm_shim(ddp, hook, site, call), self._ledger)

    # -- hooks the model holds --------------------------------------------------------------
    def _path_of(self, module: Any) -> Optional[str]:
        """The module's path in the model now (or None); paths are kept by key, the module is not."""
        key = self._rec.key(module)
        path = self._paths.get(key)
        if path is None and isinstance(self._model, torch.nn.Module):
            for p, m in roots.model_modules(self._model):
                self._paths[self._rec.key(m)] = p
            path = self._paths.get(key)
        return path

    def _release(self) -> None:
        """The trace keeps no references to tensors, modules or hooks after the block."""
        self._book.clear()
        self._namer.clear()
        self._paths.clear()
        self._rec.modules.clear()  # ids are resolved: a wrapper some class kept holds no module
        self._rec = shims.Recorder(self.shapes)  # the old one's record lists now belong to the pending trace
        self._kept = kept.Kept(self._rec)
        self._module_call = None
        # a book that does not hold this session: no cycle is left, so the trace and everything it
        # holds are freed when the caller lets go of the session (not at a later full GC pass)
        self._book = HookBook(self._rec, _no_path)
        self._namer = TensorNamer(self._run_codes, self._book.kind_and_owner, self._rec.who)
        self._model = None
        self._roots = []
