"""Drive `--compare-eager`: the window runs twice in one process, first under
`torch.compiler.set_stance("force_eager")` (torch.compile's code runs as plain Python: every hook
is a Python call), then as the code runs it (compiled); each run is its own capture, and
`analysis/eager_vs_compiled.py` compares them.

- `run`: the factory is called once (inside the eager run's capture, so a graph it compiles is
  seen), then its `--steps` steps run under force_eager, then the same steps again compiled.
- `exec`: the script runs once; its window is `--steps` steps under force_eager from step `--start`
  on, then the next `--steps` steps compiled (`CompareWindow`).

`Watch` reads what Dynamo did in the compiled run: graphs compiled per step (Dynamo's counters) and
the warning Dynamo logs when it hits its recompile limit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..analysis.eager_vs_compiled import Comparison, Side, compare
from ..capture.session import TraceSession
from ..inputs import coerce_result, prepare, resolve_device
from ..options import RunOptions, UsageError
from ..target import Factory
from .driver import Result, open_capture
from .factory import _call_factory, _check_torch, _Progress, _step
from .failure import describe_error
from .script import ExecOptions, Script, _Window

FORCE_EAGER = "force_eager"
_LIMIT_LOGGER = "torch._dynamo.convert_frame"  # where Dynamo warns that it hit a recompile limit


class Watch(logging.Handler):
    """Graphs Dynamo compiles per step, and its recompile-limit warning, while installed. A handler
    of Dynamo's own logger: the warning is still printed as it would be untraced."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.per_step: list[int] = []
        self.limit: Optional[str] = None
        self._last = 0

    @staticmethod
    def _graphs() -> int:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])

    def __enter__(self) -> Watch:
        self._last = self._graphs()
        logging.getLogger(_LIMIT_LOGGER).addHandler(self)
        return self

    def step_ended(self) -> None:
        now = self._graphs()
        self.per_step.append(now - self._last)
        self._last = now

    def __exit__(self, *exc: Any) -> None:
        logging.getLogger(_LIMIT_LOGGER).removeHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if self.limit is not None or "hit config." not in str(record.msg):
            return
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) >= 4:  # (limit type, limit, function, last reason, ...)
            reason = str(args[3]).strip().splitlines()[0] if str(args[3]).strip() else "?"
            self.limit = f"hit config.{args[0]} ({args[1]}) compiling {args[2]}; last reason: {reason}"
        else:
            self.limit = record.getMessage().splitlines()[0]


def side(session: TraceSession, facts: dict[str, Any], watch: Optional[Watch] = None) -> Side:
    """What one run gives the comparison: its trace and what the capture saw Dynamo do."""
    trace = session.trace  # built now: `facts` is filled as its surprises are found
    forward = getattr(getattr(session, "_capture", None), "_forward_compiled", None)
    effects = dict(getattr(forward, "effects", None) or {})
    return Side(
        trace=trace,
        graphs=facts.get("compiled_graphs"),
        effects=effects,
        compiled_paths=frozenset(facts.get("compiled_calls") or ()),
        graphs_per_step=list(watch.per_step) if watch is not None else [],
        limit=watch.limit if watch is not None else None,
    )


@dataclass
class Compared:
    """Both runs, their comparison (None when the eager run did not finish), how it ended."""

    eager: Side
    compiled: Optional[Side] = None
    comparison: Optional[Comparison] = None
    error: Optional[str] = None
    exception: Optional[BaseException] = None
    notes: list[str] = field(default_factory=list)

    def finish(self) -> Compared:
        if self.compiled is not None:
            self.comparison = compare(self.eager, self.compiled)
        return self


def check(options: RunOptions) -> None:
    """UsageError for what --compare-eager cannot do with `run`."""
    if options.warmup:
        raise UsageError(
            "--compare-eager runs the steps twice itself (force_eager, then compiled); drop --warmup"
        )


def compare_run(factory: Factory, options: RunOptions) -> Compared:
    """`run --compare-eager`: the factory once, its steps under force_eager, then again compiled."""
    options.check()
    check(options)
    _check_torch()
    resolve_device(options.device)
    import torch

    notes: list[str] = []
    progress = _Progress()
    with factory.on_sys_path():
        facts: dict[str, Any] = {}
        eager = open_capture(target=factory.spec, shapes=options.shapes, facts=facts)
        exception: Optional[BaseException] = None
        with eager:
            try:
                target = coerce_result(_call_factory(factory), factory.label)
                eager.attach(target.model)
                prepared = prepare(target, options)
                notes += prepared.notes
                with torch.compiler.set_stance(FORCE_EAGER):
                    _steps(eager, prepared, options, notes, progress, None)
            except UsageError:
                raise
            except Exception as exc:  # the model or a hook raised: the partial trace is kept
                exception = exc
        _meta(eager, factory.spec, options, FORCE_EAGER)
        result = Compared(eager=side(eager, facts), notes=notes)
        if exception is not None:
            return _failed(result, eager, exception, "eager (force_eager)")
        facts = {}
        compiled = open_capture(target=factory.spec, shapes=options.shapes, facts=facts)
        with Watch() as watch, compiled:
            try:
                compiled.attach(target.model)
                _steps(compiled, prepared, options, notes, progress, watch)
            except Exception as exc:
                exception = exc
        _meta(compiled, factory.spec, options, "compiled")
        result.compiled = side(compiled, facts, watch)
        if exception is not None:
            return _failed(result, compiled, exception, "compiled")
    return result.finish()


def _steps(
    session: TraceSession, prepared: Any, options: RunOptions, notes: list[str], progress: _Progress,
    watch: Optional[Watch],
) -> None:  # fmt: skip
    for step in range(options.steps):
        if step:
            session.mark_step()
        progress.step = step
        _step(prepared, options.backward, notes, progress)
        if watch is not None:
            watch.step_ended()


def _meta(session: TraceSession, spec: str, options: RunOptions, run: str) -> None:
    session.set_meta(target=f"{spec} ({run})", steps=options.steps)


def _failed(result: Compared, session: TraceSession, exc: BaseException, run: str) -> Compared:
    result.exception = exc
    result.error = f"in the {run} run: " + describe_error(session.trace, exc)
    return result.finish()


class CompareWindow(_Window):
    """`exec --compare-eager`: `steps` steps from `start` on under force_eager, then `steps` more
    compiled, each in its own capture; the trace handed to `on_trace` is the compiled one, and
    `compared` holds both."""

    def __init__(
        self,
        script: Script,
        options: ExecOptions,
        on_trace: Callable[[Result], None],
        on_step: Optional[Callable[[int, bool], None]] = None,
    ) -> None:
        super().__init__(script, options, on_trace, on_step)
        self.compared: Optional[Compared] = None
        self._stance: Any = None
        self._watch: Optional[Watch] = None

    def open(self) -> None:
        import torch

        self.facts = {}
        if self.compared is None:  # the eager run first
            self._stance = torch.compiler.set_stance(FORCE_EAGER)
        super().open()

    def step_ended(self) -> None:
        if getattr(self, "forked", False):  # a forked child counts nothing (as `_Window`)
            return
        if self._watch is not None and self.state == "open":
            self._watch.step_ended()
        options = self.options
        if self.compared is None and self.state == "open" and self.ended + 1 >= options.start + options.steps:
            self.ended += 1
            if self.on_step is not None:
                self.on_step(self.ended - options.start, False)
            self._switch()
            return
        super().step_ended()

    def _switch(self) -> None:
        """The eager run's window is over: close its capture, and open the compiled run's."""
        self.session.__exit__(None, None, None)
        self.watch.rewrap()
        self.session.set_meta(target=f"{self.script.label} (force_eager)")
        self._restore_stance()
        self.compared = Compared(eager=side(self.session, self.facts or {}))
        self.registrations.install()
        self._watch = Watch().__enter__()
        self.options = _shifted(self.options)
        self.open()

    def _restore_stance(self) -> None:
        if self._stance is not None:
            self._stance.__exit__(None, None, None)
            self._stance = None

    def close(self, ended_by: Optional[str] = None) -> Result:
        self._restore_stance()
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.__exit__(None, None, None)
        result = super().close(ended_by)
        if self.compared is None:  # the script ended inside the eager run's window
            if self.session is not None:
                self.compared = Compared(eager=side(self.session, self.facts or {}))
        elif self.compared.compiled is None and self.session is not None:
            self.compared.compiled = side(self.session, self.facts or {}, watch)
            self.compared.finish()
        result.compared = self.compared
        return result


def _shifted(options: ExecOptions) -> ExecOptions:
    """The compiled run's window: the `steps` steps after the eager run's."""
    from dataclasses import replace

    return replace(options, start=options.start + options.steps)
