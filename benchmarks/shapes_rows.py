"""Rows that time `--shapes` (`hooktrace.trace(model, shapes=True)`): what describing each hook call's
tensors costs, against the same steps untraced and traced without shapes, in one process."""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any, Callable

from capture_rows import hook_heavy_model, transformer_model
from common import Row


def _triples(runs: dict[str, Callable[[], float]], n: int) -> dict[str, list[float]]:
    """`n` rounds of every run, the order rotating each round (drift falls on each run alike)."""
    names = list(runs)
    out: dict[str, list[float]] = {name: [] for name in names}
    for i in range(n):
        gc.collect()
        for name in names[i % len(names) :] + names[: i % len(names)]:
            out[name].append(runs[name]())
    return out


def _shapes_row(key: str, what: str, model: Any, step: Callable[[], None], quick: bool) -> Row:
    import hooktrace

    rounds, warmup, reps = (4, 2, 2) if quick else (24, 6, 5)
    for _ in range(warmup):
        step()
        for shapes in (False, True):
            with hooktrace.trace(model, shapes=shapes):
                step()
    events: list[int] = []

    def untraced() -> float:
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        return (time.perf_counter() - t0) / reps

    def traced(shapes: bool) -> Callable[[], float]:
        def run() -> float:
            with hooktrace.trace(model, shapes=shapes) as session:
                t0 = time.perf_counter()
                for _ in range(reps):
                    step()
                t1 = time.perf_counter()
            if shapes:
                events.append(sum(1 for e in session.trace.events if e.type == "hook") // reps)
            return (t1 - t0) / reps

        return run

    times = _triples({"untraced": untraced, "traced": traced(False), "shapes": traced(True)}, rounds)
    plain, traced_, shaped = times["untraced"], times["traced"], times["shapes"]
    hook_calls = events[-1] if events else 0
    extra = statistics.median(shaped) - statistics.median(traced_)
    return Row(
        f"{key}_shapes",
        f"{what}: traced with --shapes / traced without, steps inside an open trace ({reps} per sample)",
        "ratio",
        1.5,
        [s / t for s, t in zip(shaped, traced_)],
        details={
            "shapes_over_untraced": statistics.median(s / u for s, u in zip(shaped, plain)),
            "traced_over_untraced": statistics.median(t / u for t, u in zip(traced_, plain)),
            "untraced_ms": statistics.median(plain) * 1e3,
            "traced_ms": statistics.median(traced_) * 1e3,
            "shapes_ms": statistics.median(shaped) * 1e3,
            "hook_calls_per_step": hook_calls,
            "shapes_us_per_hook_call": extra / max(hook_calls, 1) * 1e6,
            "rounds": rounds,
        },
    )


def _bytecodes(call: Callable[[], Any]) -> int:
    """Python bytecodes one call runs (sys.settrace opcode events): the machine-independent figure."""
    import sys

    count = 0

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        frame.f_trace_opcodes = True
        count += event == "opcode"
        return tracer

    call()  # the texts' cache warm, as in a step after the first
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return count


def _shim_row(quick: bool) -> Row:
    """µs per call that --shapes adds to a forward hook's shim, called as PyTorch calls it
    (module, (x,), output) with real tensors, in a tight loop; repeats alternate on and off."""
    import torch

    from hooktrace.capture.shims import Recorder, make_shim

    def fwd_hook(module: Any, args: Any, output: Any) -> None:
        return None

    module, x = torch.nn.Linear(64, 64), torch.randn(32, 64)
    out = module(x)
    recorders = {on: Recorder(on) for on in (False, True)}
    shims = {on: make_shim(rec, fwd_hook, 0, "forward", module, False) for on, rec in recorders.items()}
    n, repeats = (5_000, 4) if quick else (50_000, 12)
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(repeats):
        for on in (False, True) if i % 2 == 0 else (True, False):
            shim, args = shims[on], (module, (x,), out)
            gc.collect()
            t0 = time.perf_counter()
            for _ in range(n):
                shim(*args)
            times[on].append((time.perf_counter() - t0) / n * 1e6)
            recorders[on].hooks.clear()
            if recorders[on].shapes is not None:
                recorders[on].shapes.clear()
    extra = [t - p for p, t in zip(times[False], times[True])]
    bytecodes = {on: _bytecodes(lambda s=shim: s(module, (x,), out)) for on, shim in shims.items()}
    return Row(
        "shapes_shim",
        "µs a forward hook's shim takes more with --shapes: (module, (x,), output), x and output f32[32,64]",
        "us",
        5.0,
        extra,
        details={
            "shim_us": statistics.median(times[False]),
            "shim_with_shapes_us": statistics.median(times[True]),
            "calls_per_repeat": n,
            "bytecodes_per_call": bytecodes[False],  # Python bytecodes of one call, the hook's own included
            "bytecodes_per_call_with_shapes": bytecodes[True],
            "text": "(f32[32,64] cpu,), f32[32,64] cpu",
        },
    )


def bench_shapes(quick: bool) -> list[Row]:
    hook_heavy, hook_step = hook_heavy_model()
    transformer, transformer_step = transformer_model()
    return [
        _shim_row(quick),
        _shapes_row("hook_heavy", "hook-heavy 150x(Linear,ReLU), 4 hooks/Linear", hook_heavy, hook_step, quick),
        _shapes_row(
            "transformer", "TransformerEncoder 2x256, pre+fwd hook on every module", transformer,
            transformer_step, quick,
        ),
    ]  # fmt: skip
