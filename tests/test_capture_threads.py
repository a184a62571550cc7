"""Another thread registers and removes hooks while captures start, run and end: no error from hooktrace.

PyTorch's own dicts may change between any two bytecodes of the capture (the GIL switches there);
the capture reads each dict in one C-level copy and looks a hook up again before it replaces one.
The switch interval is made tiny so the threads interleave often.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from typing import Any

import torch
import torch.nn.modules.module as nn_module
from torch import nn

import hooktrace

HOOKTRACE_DIR = os.path.dirname(hooktrace.__file__)


def _hook(*args: Any) -> None:
    return None


def test_enter_run_and_exit_while_another_thread_registers_and_removes_hooks():
    torch.manual_seed(0)
    m = nn.Sequential(*[nn.Linear(2, 2) for _ in range(8)])
    params = list(m.parameters())
    stop = threading.Event()
    errors: list[str] = []

    def hammer() -> None:
        try:
            while not stop.is_set():
                handles = [mod.register_forward_hook(_hook) for mod in m]
                handles += [mod.register_forward_pre_hook(_hook, prepend=True) for mod in m]
                handles += [mod.register_full_backward_hook(_hook) for mod in m[:2]]
                handles += [p.register_hook(_hook) for p in params]
                handles.append(nn_module.register_module_forward_hook(_hook))
                for h in handles:
                    h.remove()
        except BaseException as e:  # the hammer's own errors fail the test too
            errors.append("".join(traceback.format_exception(e)))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=hammer)
    thread.start()
    outcomes = []
    try:
        for _ in range(40):
            try:
                with hooktrace.trace(m) as t:
                    m(torch.ones(1, 2, requires_grad=True)).sum().backward()
                t.to_dict()
                outcomes.append(None)
            except Exception as e:  # PyTorch's own errors may happen (as untraced); hooktrace's must not
                outcomes.append(e)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert not errors, errors[0]
    raised_in_hooktrace = [
        e
        for e in outcomes
        if e is not None and traceback.extract_tb(e.__traceback__)[-1].filename.startswith(HOOKTRACE_DIR)
    ]
    assert not raised_in_hooktrace, "".join(traceback.format_exception(raised_in_hooktrace[0]))
    assert outcomes.count(None) > 0
    for mod in m:  # nothing left behind
        assert not mod._forward_hooks and not mod._forward_pre_hooks and not mod._backward_hooks
    assert not any(p._backward_hooks for p in params)
