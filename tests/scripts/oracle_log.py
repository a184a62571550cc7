"""What the test scripts' hooks use to record themselves: one line per call, `<step> <name>`, in the
file named by HOOKTRACE_TEST_LOG (so tests compare hooktrace's order with the hooks' own record)."""

from __future__ import annotations

import os

STEP = [0]  # the script's own count of optimizer steps (or backward calls): the hooks' step


def record(name: str) -> None:
    path = os.environ.get("HOOKTRACE_TEST_LOG")
    if path and "RANK" in os.environ:  # one log per rank
        path = f"{path}.rank{os.environ['RANK']}"
    if path:
        with open(path, "a") as f:
            f.write(f"{STEP[0]} {name}\n")


def logged(path: str, first: int, last: int) -> list[str]:
    """Names logged in steps first..last (inclusive)."""
    out = []
    with open(path) as f:
        for line in f:
            step, name = line.split()
            if first <= int(step) <= last:
                out.append(name)
    return out
