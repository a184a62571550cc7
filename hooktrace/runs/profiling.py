"""`--profile PATH`: the run under `torch.profiler.profile`, its Chrome trace written to PATH.

While the profiler records, every traced hook call is a `record_function` range
`hook <kind> <name>` (capture/shims.py), so the profiler's trace shows the hooks among the
operators and kernels they ran (TensorBoard, Perfetto). The file is written atomically: a run that
fails to export leaves an earlier file at PATH as it was. When the caller gives a `merge` (render/merged.py's
`merge_profile`, from a floor above) and sets the holder's `trace`, the file also holds hooktrace's
events, aligned on the profiler's timeline.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ..options import UsageError

__all__ = ["Profiled", "check_profile_path", "profiled"]


def check_profile_path(path: Optional[Path]) -> None:
    """UsageError, before anything runs, when PATH cannot be written."""
    if path is None:
        return
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"--profile {path}: the folder {folder} does not exist; create it first")
    if path.is_dir():
        raise UsageError(f"--profile {path} is a folder; give a file name such as {path / 'profile.json'}")


class Profiled:
    """What `profiled` yields: set `trace` to the run's trace to merge it into the file."""

    trace: Any = None


@contextlib.contextmanager
def profiled(path: Optional[Path], merge: Optional[Callable[[Any, Any], Any]] = None) -> Iterator[Profiled]:
    """Run the block under torch.profiler (CPU, and CUDA when available); write its Chrome trace,
    with the holder's trace put in by `merge(trace, chrome_document)` when both are given."""
    holder = Profiled()
    if path is None:
        yield holder
        return
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        yield holder
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=".tmp", dir=path.parent if str(path.parent) else "."
    )
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        if merge is not None and holder.trace is not None and holder.trace.meta.clock_unix_ns is not None:
            from ..io import dumps, loads

            merged = merge(holder.trace, loads(Path(tmp).read_bytes()))
            Path(tmp).write_bytes(dumps(merged, newline=True))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
