"""Rows of issue 34: an empty session's cost, and a long window's (flat per-step cost, memory per event)."""

from __future__ import annotations

import gc
import json
import statistics
import subprocess
import sys
import time
import tracemalloc
from typing import Any

from common import HERE, Row


def _linear_chain(n: int) -> Any:
    from torch import nn

    return nn.Sequential(*[nn.Linear(4, 4) for _ in range(n - 1)])  # n modules with the Sequential


def bench_empty(quick: bool) -> list[Row]:
    """`with hooktrace.trace(model): pass`, wall ms per session, many repeats in this process (the
    process's first session, which marks hooktrace's code for Dynamo, is not timed: warm-up)."""
    import hooktrace

    rows = []
    repeats = 20 if quick else 200
    for n, target in ((10, 1.0), (1000, 10.0)):
        model = _linear_chain(n)
        for _ in range(3):
            with hooktrace.trace(model):
                pass
        wall, cpu = [], []
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.thread_time()
            with hooktrace.trace(model):
                pass
            cpu.append((time.thread_time() - c0) * 1e3)
            wall.append((time.perf_counter() - t0) * 1e3)
        rows.append(
            Row(
                f"empty_session_{n}",
                f"empty `with hooktrace.trace(model): pass` on {n} modules (Linear(4,4) in a Sequential), ms",
                "ms",
                target,
                wall,
                details={"cpu_ms_median": statistics.median(cpu), "cpu_ms_min": min(cpu), "repeats": repeats},
            )
        )
    return rows


def bench_long(quick: bool) -> list[Row]:
    """1,000 hook-heavy steps (forward + backward) inside one open trace: each step's time, and the
    last 100 steps' median over the first 100's (flat: about 1; growth with the events held: above)."""
    from capture_rows import hook_heavy_model

    import hooktrace

    steps, window = (100, 20) if quick else (1000, 100)
    model, step = hook_heavy_model()
    for _ in range(5):
        step()
    with hooktrace.trace(model):
        step()
    times: list[float] = []
    gc.collect()
    with hooktrace.trace(model) as session:
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
    events = len(session.trace.events)
    first, last = times[:window], times[-window:]
    tenths = [statistics.median(times[i : i + steps // 10]) * 1e3 for i in range(0, steps, steps // 10)]
    del session
    return [
        Row(
            "hook_heavy_long_window",
            f"hook-heavy, {steps} steps in one open trace: median step time of the last {window} over the "
            f"first {window} (flat = 1)",
            "ratio",
            1.05,
            [statistics.median(last) / statistics.median(first)],
            details={
                "steps": steps,
                "events": events,
                "step_ms_by_tenth": [round(t, 2) for t in tenths],
                "first_ms": statistics.median(first) * 1e3,
                "last_ms": statistics.median(last) * 1e3,
            },
        )
    ]


def _long_child(variant: str, steps: int, measure: str) -> dict[str, Any]:
    """Fresh process: `steps` forward + backward steps of a 10-block hook-heavy model (82 events a step),
    untraced or inside one trace; bytes that stay after the steps (read inside the block), per event."""
    import torch
    from capture_rows import _reset_peak, _rss_now, hook_heavy_model

    import hooktrace
    import hooktrace.capture  # noqa: F401  (both variants pay the same imports)

    torch.set_num_threads(1)
    model, step = hook_heavy_model(10)
    for _ in range(20):
        step()
    out: dict[str, Any] = {"variant": variant, "measure": measure, "events": 0}

    def measured() -> None:
        gc.collect()
        if measure == "tracemalloc":
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(steps):
                step()
            gc.collect()
            out["bytes"] = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
        else:
            out["peak_reset"] = _reset_peak()
            before = _rss_now()[0]
            for _ in range(steps):
                step()
            out["bytes"] = _rss_now()[1] - before

    if variant == "traced":
        with hooktrace.trace(model) as session:
            measured()
        out["events"] = len(session.trace.events)
    else:
        measured()
    return out


def _run(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(HERE), "--long-child", *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"long child {args} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_long_memory(quick: bool) -> list[Row]:
    """Memory per event after 10,000 steps in one trace (peak RSS traced - untraced; tracemalloc)."""
    steps = 1000 if quick else 10_000
    untraced, traced = _run("untraced", str(steps), "rss"), _run("traced", str(steps), "rss")
    events = traced["events"]
    rss = (traced["bytes"] - untraced["bytes"]) / events
    py = None
    if not quick:  # two more processes
        py_untraced = _run("untraced", str(steps), "tracemalloc")
        py_traced = _run("traced", str(steps), "tracemalloc")
        py = (py_traced["bytes"] - py_untraced["bytes"]) / py_traced["events"]
    return [
        Row(
            "memory_per_event_long",
            f"memory per event after {steps} steps in one trace (10-block hook-heavy, fwd+bwd; peak RSS "
            "traced - untraced, read inside the block)",
            "B",
            200.0,
            [rss],
            details={"steps": steps, "events": events, "tracemalloc_bytes_per_event": py},
        )
    ]
