"""What the rank tests share: the `hooktrace` script beside this interpreter, run as a process,
and factory files of one `nn.Linear(4, 4)` with one hook (what the hook does is the test's)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

HOOKTRACE = Path(sys.executable).with_name("hooktrace")

_ONE_HOOK = """
import os
import signal

import torch
from torch import nn


{hook}


def make():
    model = nn.Linear(4, 4)
    model.{register}({name})
    return model, torch.randn(2, 4)
"""


def one_hook_factory(path: Path, hook: str, register: str) -> Path:
    """Write a factory file at `path`: `hook` (the source of one function; `os`, `signal`, `torch`
    and `nn` are imported) registered on a Linear(4, 4) by `register` (`register_forward_hook`...)."""
    hook = textwrap.dedent(hook).strip()
    name = hook.split("(", 1)[0].removeprefix("def ").strip()
    path.write_text(_ONE_HOOK.format(hook=hook, register=register, name=name))
    return path


def default_stop_signals() -> None:
    """In the child: the stop signals as a terminal gives them. The suite may run under `nohup` (SIGHUP
    ignored) or as a background job of a shell without job control (SIGINT and SIGQUIT ignored): a
    child inherits an ignored signal, and hooktrace keeps it ignored by design, so it would not end
    on the signal a test sends."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


def hooktrace_process(*args: str, env: dict[str, str]) -> subprocess.Popen:
    """`hooktrace ARGS` started with the stop signals at their defaults, its output piped as text."""
    return subprocess.Popen(
        [str(HOOKTRACE), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=default_stop_signals,
    )
