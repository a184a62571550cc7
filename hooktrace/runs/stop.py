"""The one stop policy: the only module that sets signal handlers (`install`, `restore`). SIGINT /
SIGTERM during a traced run: the run stops, the capture restores, the partial trace is kept. The
script driver, the rank launcher and the rank worker set theirs through `install` too."""

from __future__ import annotations

import signal
import threading
from typing import Any, Iterable, Mapping, Optional


class Stopped(BaseException):
    """The one control-flow exception for "stopped": a stop signal (`signal`: SIGINT, SIGTERM, SIGHUP
    to a run, a rank or the rank launcher) or the end of exec's window (`step`: the steps after which
    hooktrace stopped the script; `signal` None). Like KeyboardInterrupt, not an error of the model:
    a BaseException, so a program's `except Exception` does not take it."""

    def __init__(
        self, signum: Optional[int] = None, message: Optional[str] = None, *, step: Optional[int] = None
    ) -> None:
        self.signal = signal.Signals(signum) if signum is not None else None
        self.step = step
        if message is None:
            message = (
                f"{self.signal.name} (the run was stopped)"
                if self.signal is not None
                else f"hooktrace stopped the script after step {step}"
            )
        super().__init__(message)


def install(signals: Iterable[int], handler: Any, *, only_default: bool = False) -> dict[int, Any]:
    """Set `handler` for each signal (in the main thread; elsewhere none can be set) and return the
    handlers found, for `restore`. A signal found ignored (`nohup`) stays ignored; with
    `only_default`, a signal the program handles itself keeps its handler."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    found: dict[int, Any] = {}
    for sig in signals:
        previous = signal.getsignal(sig)
        if previous is signal.SIG_IGN or (only_default and previous != signal.SIG_DFL):
            continue
        signal.signal(sig, handler)
        found[sig] = previous
    return found


def restore(saved: Mapping[Any, Any], only_if: Any = None) -> None:
    """Put back the handlers `install` found (with `only_if`: where that handler is still set)."""
    for sig, previous in saved.items():
        if only_if is None or signal.getsignal(sig) == only_if:
            signal.signal(sig, signal.SIG_DFL if previous is None else previous)


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal, a dropped ssh session) raise `Stopped` while `armed` (the factory and the steps run); otherwise,
    e.g. while the capture restores the hook dicts, they are only remembered in `pending`."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

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

    def __enter__(self) -> StopSignals:
        if self.enabled:
            self._saved = install(self.SIGNALS, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        restore(self._saved)


class ScriptSignals:
    """`exec`'s: SIGTERM and SIGHUP (a closed terminal, a dropped ssh session) raise `Stopped` in the
    script (as for `run`), unless the script set its own handler or the signal is ignored (`nohup`). SIGINT keeps
    Python's own handler: the script sees KeyboardInterrupt, as it would untraced."""

    def __init__(self) -> None:
        self._saved: dict[int, Any] = {}
        self.forked = False

    def __enter__(self) -> ScriptSignals:
        self._saved = install((signal.SIGTERM, signal.SIGHUP), self._handler, only_default=True)
        return self

    def release(self) -> None:
        """Put SIGTERM's handler back now (a forked child is not stopped as the traced script)."""
        restore(self._saved, only_if=self._handler)
        self._saved = {}

    @staticmethod
    def _handler(signum: int, frame: Any) -> None:
        raise Stopped(signum)

    def __exit__(self, *exc: Any) -> None:
        restore(self._saved, only_if=self._handler)
