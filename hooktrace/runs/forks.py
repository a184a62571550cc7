"""Children the script forks (`os.fork`, multiprocessing's fork, a DataLoader worker) are not the
traced process: in them the window counts no step, stops nothing and writes nothing, and SIGTERM is
handled as the script left it (multiprocessing's `terminate()` ends a worker as untraced).

`run_script` puts the window and its SIGTERM handler of the script this process runs in `RUNNING`
for as long as the script runs; `watch` registers the after-fork handler once per process.
"""

from __future__ import annotations

import os
from typing import Any

from .stop import ScriptSignals

RUNNING: list[Any] = []  # the window and the ScriptSignals of the script now running
_REGISTERED: list[bool] = []


def _after_fork_in_child() -> None:
    for running in RUNNING:
        running.forked = True
        if isinstance(running, ScriptSignals):
            running.release()


def watch() -> None:
    """Register the after-fork handler (once a process; os.register_at_fork has no unregister)."""
    if not _REGISTERED and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _REGISTERED.append(True)
