"""What every rank of `run --nproc` / `exec --nproc` runs, as data: the driver and its options."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any


def _plain(options: Any) -> dict[str, Any]:
    """The run options (keyword arguments of `hooktrace.runs.factory.run`) as JSON for the workers."""
    if options is None:
        return {}
    if dataclasses.is_dataclass(options) and not isinstance(options, type):
        options = dataclasses.asdict(options)
    # As the workers will receive them; a value JSON cannot carry is the caller's bug: it fails here.
    return json.loads(json.dumps(dict(options)))


@dataclass(frozen=True)
class Job:
    """What every rank runs, as data: the driver (`run`: a model factory, TARGET; `exec`: a script,
    SCRIPT.py ARGS... or MODULE ARGS... with `as_module`) and its options (the driver's options
    dataclass: RunOptions or ExecOptions), which reach each rank as JSON of their fields."""

    driver: str
    target: str = ""
    script: tuple[str, ...] = ()
    as_module: bool = False
    options: Any = None

    def data(self) -> dict[str, Any]:
        return {"driver": self.driver, "target": self.target, "script": list(self.script),
                "as_module": self.as_module, "options": _plain(self.options)}  # fmt: skip
