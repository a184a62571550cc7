"""hooktrace: see the order in which PyTorch hooks really fire, and why.

Public API (SPEC §3)::

    import hooktrace
    with hooktrace.trace(model) as t:
        model(x).sum().backward()
    t.to_dict(); t.save("run.json"); hooktrace.load("run.json")

Importing this package does not import torch; `trace()` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from .inputs import Inputs, Target
from .schema import Trace, TraceFormatError, load

if TYPE_CHECKING:
    from .capture import TraceSession

__all__ = ["trace", "load", "Trace", "TraceFormatError", "Target", "Inputs"]
__version__ = "0.1.0"


def trace(model: Optional[Any] = None, *, target: Optional[str] = None) -> TraceSession:
    """Trace every hook that fires inside the `with` block.

    `model` names module paths and has its pre-existing hooks inventoried. It may be None and
    given later with `session.attach(model)` (the CLI calls the factory inside the capture).
    """
    from .capture import TraceSession

    return TraceSession(model, target=target)
