"""Which torch hooktrace traces with: 2.8 to 2.15 (README "Torch versions"), told in one line otherwise.

torch 2.8 to 2.14 were run by hand (scripts/torch_matrix.sh; README "Torch versions" says what ran
on each and when), 2.15's source was checked (scripts/check_torch_source.py). An older torch is refused at the first use, before any of the
capture's code touches PyTorch's internals; a newer one is traced if every source rewrite and check
of the capture still applies (capture/views.py), else refused with the same line and the reason.
This module does not import torch until `require()` is called.
"""

from __future__ import annotations

import re
from typing import Any, Optional

OLDEST = (2, 8)
SUPPORTED_TORCH = "2.8–2.15"


class UnsupportedTorch(RuntimeError):
    """This torch is older than hooktrace supports, or its source does not have what the capture
    rewrites: nothing is traced."""


def refusal(version: Any, why: Optional[str] = None) -> UnsupportedTorch:
    """The one line: "hooktrace supports torch 2.8–2.15; this is 2.X" (and why, when a check failed)."""
    line = f"hooktrace supports torch {SUPPORTED_TORCH}; this is {version}"
    return UnsupportedTorch(f"{line} ({why})" if why else line)


def release(version: str) -> Optional[tuple[int, int]]:
    """(major, minor) of a torch version string ("2.8.0+cu128", "2.10.0a0+git1234"), None if unreadable."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def require() -> None:
    """UnsupportedTorch when the installed torch is older than 2.8 (read each time: tests fake it)."""
    import torch

    version = str(torch.__version__)
    got = release(version)
    if got is not None and got < OLDEST:
        raise refusal(version)
