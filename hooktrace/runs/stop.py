"""SIGINT / SIGTERM during a traced run: the run stops, the capture restores, the partial trace is kept."""

from __future__ import annotations

import signal
import threading
from typing import Any, Optional


class Stopped(BaseException):
    """Raised in the run by SIGINT / SIGTERM: like KeyboardInterrupt, not an error of the model."""

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum)
        super().__init__(f"{self.signal.name} (the run was stopped)")


class StopSignals:
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

    def __enter__(self) -> StopSignals:
        if self.enabled:
            for sig in self.SIGNALS:
                self._saved[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in self._saved.items():
            signal.signal(sig, previous)
