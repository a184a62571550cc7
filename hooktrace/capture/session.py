"""`hooktrace.trace(model)`: the session users hold. It opens and closes the capture (core.py
`Capture`), builds the trace from what the block left (`build`) and has it analysed by the function
the API or driver passed (the capture analyses nothing).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..io import gc_paused
from ..schema import Surprise, Trace
from . import build, optim, views
from .core import Capture
from .records import Site


def check_torch() -> None:
    """Make the rewritten copies of PyTorch's methods now: UnsupportedTorch if this torch is older than
    hooktrace supports or its source does not match."""
    views.copies()
    optim.copies()


class TraceSession:
    """Context manager returned by `hooktrace.trace()`. After the block: `.trace`, `to_dict()`, `save()`."""

    def __init__(
        self,
        model: Any = None,
        *,
        target: Optional[str] = None,
        analyse: Optional[Callable[..., list[Surprise]]] = None,
        describe: Optional[Callable[[Trace], str]] = None,
        shapes: bool = False,
    ) -> None:
        """`analyse(trace, deleted=ids, compiled_calls=windows, compiled_graphs=graphs, ...)`: the trace's
        surprises, made when it is built from the capture's facts (ids: hooks their own code took out of
        their dict; windows: the module calls that ran compiled, `build.compiled_windows`; graphs: the
        hooks Dynamo compiled into graphs, `build.compiled_graphs`; and the rest of
        `find_surprises`' keywords, `unseen_backward` among them); `describe(trace)`:
        the counts the session's repr shows. The API and the drivers pass `analysis.surprises.find_surprises` and
        `analysis.counts.summary`: the capture analyses nothing. `shapes`: record what each hook
        received and returned (capture/shapes.py; `--shapes`)."""
        self._capture = Capture(model, target=target, shapes=shapes)
        self._analyse = analyse
        self._describe = describe
        self._meta_overrides: dict[str, Any] = {}
        self._trace: Optional[Trace] = None
        self.shapes = shapes
        # a backward pass a driver saw run inside the block untraced ("the backward of step 0's
        # forward"), told to `analyse` for never-fired's reasons; set before the trace is built
        self.unseen_backward: Optional[str] = None

    def __enter__(self) -> TraceSession:
        self._capture.open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._capture.close()

    def attach(self, model: Any) -> None:
        """Name module paths after `model` and record the hooks it already holds."""
        self._capture.attach(model)

    def live_roots(self) -> list[Any]:
        """With no model: the live modules of the outermost calls so far (`Capture.live_roots`)."""
        return self._capture.live_roots()

    def known_sites(self, found: dict[int, Site], fsdp_found: Optional[dict[Any, Any]] = None) -> None:
        """Call sites of hooks registered before the block (`Capture.known_sites`)."""
        self._capture.known_sites(found, fsdp_found)

    def mark_step(self) -> None:
        """Start the next step: later events carry `step + 1`."""
        self._capture.mark_step()

    @property
    def held_ids(self) -> set[int]:
        """Trace ids of the hooks the dicts held when the block ended (`Capture.held_ids`)."""
        return self._capture.held_ids

    def set_meta(self, **fields: Any) -> None:
        """Override meta fields (device, target, steps, rank, world_size)."""
        self._meta_overrides.update(fields)
        if self._trace is not None:
            for key, value in fields.items():
                setattr(self._trace.meta, key, value)

    @property
    def trace(self) -> Trace:
        """The trace, built at first use from what the block left."""
        if self._trace is None:
            pending = self._capture.pending
            if pending is None:
                raise RuntimeError("the trace is available after the `with hooktrace.trace(...)` block ends")
            for key, value in self._meta_overrides.items():
                setattr(pending.meta, key, value)
            with gc_paused():
                trace = build.build_trace(pending)
                if self._analyse is not None:
                    trace.surprises = self._analyse(
                        trace,
                        deleted=pending.deleted,
                        compiled_calls=build.compiled_windows(pending),
                        replaced_nodes=pending.replaced_nodes,
                        replaced_params=pending.replaced_params,
                        compiled_graphs=build.compiled_graphs(pending),
                        unseen_backward=self.unseen_backward or pending.unseen_backward,
                    )
            self._trace = trace
            self._capture.pending = None
        return self._trace

    def to_dict(self) -> dict[str, Any]:
        return self.trace.to_dict()

    def __repr__(self) -> str:
        """One line: what the session is doing, or the counts every rendering shows."""
        if self._capture.active:
            return "<hooktrace session: recording; the trace is ready when the `with` block ends>"
        if self._trace is None and self._capture.pending is None:
            return "<hooktrace session: not started; use it as `with hooktrace.trace(model) as t:`>"
        trace = self.trace
        target = f" {trace.meta.target}" if trace.meta.target else ""
        what = (
            self._describe(trace)
            if self._describe
            else f"{len(trace.hooks)} hooks, {len(trace.events)} events"
        )
        return f"<hooktrace session{target}: {what}>"

    def save(self, path: str) -> None:
        self.trace.save(path)
