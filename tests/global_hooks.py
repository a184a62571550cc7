"""The global module hook state of `torch.nn.modules.module`, kept across a block (tests/conftest.py)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def global_module_hooks_kept() -> Iterator[None]:
    """After the block, every global hook dict and flag is as it was before.

    All of them: PyTorch's own `RemovableHandle` of a global forward hook registered
    `with_kwargs=True` leaves its id in `_global_forward_hooks_with_kwargs` after `remove()`, and a
    global full backward hook leaves `_global_is_full_backward_hook` set for good; either makes
    `_has_any_global_hook()` true, so `torch.compile(module)` warned about global hooks in unrelated
    later tests (test_libs_smaller filtered that warning).
    """
    module = sys.modules.get("torch.nn.modules.module")
    if module is None:
        yield
        return
    names = [n for n, v in vars(module).items() if n.startswith("_global_") and isinstance(v, dict)]
    saved = {name: list(getattr(module, name).items()) for name in names}
    full_backward = getattr(module, "_global_is_full_backward_hook", None)
    try:
        yield
    finally:
        for name, items in saved.items():
            d = getattr(module, name)
            if list(d.items()) != items:
                d.clear()
                d.update(items)
        if hasattr(module, "_global_is_full_backward_hook"):
            module._global_is_full_backward_hook = full_backward
