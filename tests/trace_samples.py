"""Small traces the trace-format tests share (hand-built, so the tests do not depend on capture)."""

from __future__ import annotations

from pathlib import Path

from hooktrace.io import dumps
from hooktrace.schema import Event, Hook, Meta, Module, Surprise, Trace

THREAD = 140_245_819_283_264  # a real CPython thread ident is this long


def sample() -> Trace:
    hooks = [
        Hook(
            id=3,
            kind="forward_pre",
            scope="module",
            module="fc",
            name="f",
            prepend=True,
            prepend_source="registration",
        ),
        Hook(id=9, kind="grad", scope="tensor", module="fc", tensor="fc.weight", name="g"),
    ]
    events = [
        Event(0, 0, "enter", "forward", "fc", None, None, THREAD, 0, 50, False, None),
        Event(1, 0, "hook", "forward", "fc", 3, "forward_pre", THREAD, 5, 2, True, None),
        Event(2, 0, "exit", "forward", "fc", None, None, THREAD, 50, 0, False, "ValueError: x"),
        Event(3, 0, "hook", "backward", "fc", 9, "grad", THREAD + 1, 70, 3, False, None),
    ]
    return Trace(
        Meta(torch="2.13.0", python="3.11", steps=1, created="2026-12-02T00:00:00+00:00"),
        [Module("", "Sequential"), Module("fc", "Linear")],
        hooks,
        events,
        [Surprise("replaced-value", "m", [3], [1]), Surprise("never-fired", "n", [9], [], level="info")],
    )


def v1_dict(t: Trace) -> dict:
    """The version 1 document of `t`, as hooktrace wrote it before version 2."""
    d = t.to_dict()
    d["version"] = 1
    d["events"] = [
        {k: v for k, v in e._asdict().items() if k not in ("shapes", "graph")} for e in t.events
    ]  # v1 had neither
    for s in d["surprises"]:
        del s["level"]
    return d


def write(path: Path, data) -> Path:
    path.write_bytes(dumps(data))
    return path


def realistic(n: int) -> Trace:
    """Events shaped like a real capture: enter, four hooks, exit per call over 300 module paths."""
    paths = [f"layers.{i // 8}.sub{i % 8}" for i in range(300)]
    hooks = [
        Hook(id=10 + i, kind=("forward_pre", "forward", "forward", "grad")[i % 4], scope="module")
        for i in range(600)
    ]
    events, t = [], 1_000_000
    for seq in range(n):
        r, path = seq % 6, paths[(seq // 6) % 300]
        t += 1_350
        if r in (0, 5):
            events.append(
                Event(
                    seq,
                    0,
                    "enter" if r == 0 else "exit",
                    "forward",
                    path,
                    None,
                    None,
                    THREAD,
                    t,
                    41_000 if r == 0 else 0,
                    False,
                    None,
                )
            )
        else:
            kind = ("forward_pre", "forward", "forward", "grad")[r - 1]
            events.append(
                Event(
                    seq,
                    0,
                    "hook",
                    "backward" if kind == "grad" else "forward",
                    path,
                    10 + (seq // 6 % 150) * 4 + r - 1,
                    kind,
                    THREAD,
                    t,
                    712,
                    False,
                    None,
                )
            )
    return Trace(Meta(), [Module(p, "Linear") for p in paths], hooks, events)
