"""TARGET string -> (model, inputs, loss): loading factories, coercing what they return."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional


@dataclass
class Inputs:
    """Positional and keyword inputs for one forward call: `model(*args, **kwargs)`."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass
class Target:
    """What a factory may return: the model, optional inputs, optional `loss(output) -> scalar`."""

    model: Any
    inputs: Any = None
    loss: Optional[Callable[[Any], Any]] = None
