"""What every driver shares: the one place a capture is opened with hooktrace's analyses.

`open_capture()` is the only `TraceSession(...)` built outside `capture/`: `run`, `hooks`, `exec`,
their ranks and the Python API (`hooktrace.trace`) all open their capture here, so each trace gets
the same surprise rules (docs/surprises.md).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..analysis.surprises import find_surprises
from ..capture.session import TraceSession
from ..schema import Trace


def open_capture(
    model: Any = None,
    *,
    target: Optional[str] = None,
    shapes: bool = False,
    describe: Optional[Callable[[Trace], str]] = None,
) -> TraceSession:
    """A capture (not yet entered) whose trace carries the surprise rules' findings."""
    return TraceSession(model, target=target, analyse=find_surprises, describe=describe, shapes=shapes)
