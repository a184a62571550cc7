#!/usr/bin/env python
"""The capture's cost on a GPU, in one run of a few minutes, printed as a markdown table (issue 34).

    python benchmarks/gpu.py --device cuda [--json gpu.json] [--budget 200]
    python benchmarks/gpu.py --device cpu --quick        # the same code, small, on a CPU

What it measures, each ratio from interleaved pairs in this one process:

1. The hook-heavy model (150 x Linear+ReLU, 4 hooks per Linear), forward + backward, in-block:
   steps inside an open `hooktrace.trace()` (its opening and end not timed) over untraced steps,
   with samples of 1 step and of 15 steps (the 15-step block once measured 1.51x on an H200 where
   single steps gave 1.09x). Each step ends with `torch.cuda.synchronize()`.
2. What could make a long block cost more, measured in the same run:
   - per-step times inside the 15-step blocks, by position (first steps against last ones:
     growth with the events held);
   - the same blocks with `torch.autograd.set_multithreading_enabled(False)` (backward then runs on
     the calling thread, not on autograd's device thread): if the ratio drops, the device thread's
     cost is the cause;
   - the threads the events ran on (backward hooks on a device thread) and garbage-collector passes
     (count, time) in traced and untraced blocks;
   - a block of 15 steps without a synchronisation per step (the CPU runs ahead of the GPU: the
     capture's Python cost then hides behind, or adds to, the queued kernels).
3. A whole one-step session (open, forward, backward, SGD step, close, the trace built) against
   `torch.utils.module_tracker.ModuleTracker` and `torch.profiler.profile` on the hook-heavy model
   and on a TransformerEncoder 8 x 1024 in bfloat16 (benchmarks/peers.py, rotating rounds).

`--budget` (seconds, default 180) bounds the run: each part gets a share and stops adding pairs or
rounds once its share is spent (a minimum is always measured). The markdown table at the end is ready
for benchmarks/README.md: torch version, device name, the date.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import hook_heavy_training, measure, summary, transformer_training  # noqa: E402


class GCWatch:
    """Counts and times the garbage collector's passes while active."""

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.seconds = 0.0
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.passes[info["generation"]] += 1
            self.seconds += time.perf_counter() - self._t0

    def __enter__(self) -> GCWatch:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        gc.callbacks.remove(self)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def in_block(device: str, steps: int, budget: float, min_pairs: int, max_pairs: int, sync_each: bool) -> dict:
    """Interleaved pairs of `steps`-step samples, untraced and inside one fresh trace; ratios, per-step
    times by position, GC passes and the threads of the events."""
    import torch

    import hooktrace

    model, x = hook_heavy_training(device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def step() -> None:
        model(x).sum().backward()
        if sync_each:
            sync()

    for _ in range(3):
        step()
    with hooktrace.trace(model):
        step()
    sync()

    def block(traced: bool) -> tuple[float, list[float], GCWatch, Any]:
        per_step: list[float] = []
        session = hooktrace.trace(model) if traced else None
        if session is not None:
            session.__enter__()
        try:
            with GCWatch() as watch:
                t0 = time.perf_counter()
                for _ in range(steps):
                    s0 = time.perf_counter()
                    step()
                    per_step.append(time.perf_counter() - s0)
                sync()
                total = time.perf_counter() - t0
        finally:
            if session is not None:
                session.__exit__(None, None, None)
        return total / steps, per_step, watch, session

    ratios: list[float] = []
    untraced_ms: list[float] = []
    traced_ms: list[float] = []
    positions: dict[str, list[list[float]]] = {"untraced": [], "traced": []}
    gc_passes = {"untraced": [0, 0, 0], "traced": [0, 0, 0]}
    gc_seconds = {"untraced": 0.0, "traced": 0.0}
    threads: dict[str, int] = {}
    hook_ns: dict[str, int] = {}
    events_per_step = 0
    start = time.perf_counter()
    i = 0
    while i < min_pairs or (i < max_pairs and time.perf_counter() - start < budget):
        gc.collect()
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {}
        for traced in order:
            got[traced] = block(traced)
        (u, u_steps, u_gc, _), (t, t_steps, t_gc, session) = got[False], got[True]
        ratios.append(t / u)
        untraced_ms.append(u * 1e3)
        traced_ms.append(t * 1e3)
        positions["untraced"].append(u_steps)
        positions["traced"].append(t_steps)
        for key, watch in (("untraced", u_gc), ("traced", t_gc)):
            gc_passes[key] = [a + b for a, b in zip(gc_passes[key], watch.passes)]
            gc_seconds[key] += watch.seconds
        if i == 0 and session is not None:  # the events of one traced block: which threads
            trace = session.trace
            events_per_step = len(trace.events) // steps
            main = min(
                (e.thread for e in trace.events if e.type == "enter"), default=None
            )  # the module calls run on the thread that steps
            for e in trace.events:
                where = "main" if e.thread == main else f"other thread {e.thread}"
                threads[where] = threads.get(where, 0) + 1
                if e.type == "hook":
                    hook_ns[where] = hook_ns.get(where, 0) + e.duration_ns
        i += 1
    by_position = {}
    for key, samples in positions.items():
        by_position[key] = [_median([s[k] * 1e3 for s in samples]) for k in range(steps)]
    return {
        "steps_per_sample": steps,
        "sync_each_step": sync_each,
        "pairs": len(ratios),
        "ratio_median": _median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "untraced_ms_per_step": _median(untraced_ms),
        "traced_ms_per_step": _median(traced_ms),
        "step_ms_by_position": by_position,
        "gc_passes_per_block": {k: [round(p / len(ratios), 2) for p in v] for k, v in gc_passes.items()},
        "gc_ms_per_block": {k: v / len(ratios) * 1e3 for k, v in gc_seconds.items()},
        "events_per_step": events_per_step,
        "events_by_thread": threads,
        "hook_ms_by_thread": {k: v / 1e6 for k, v in hook_ns.items()},
    }


def single_threaded(fn: Callable[[], dict]) -> dict:
    """`fn()` with autograd's device threads off: backward runs on the thread that calls it."""
    import torch

    torch.autograd.set_multithreading_enabled(False)
    try:
        return fn()
    finally:
        torch.autograd.set_multithreading_enabled(True)


def peers_row(name: str, model: Any, x: Any, device: str, budget: float, quick: bool) -> dict:
    """Rotating rounds of untraced / hooktrace / ModuleTracker / profiler, bounded by `budget`."""
    measure(model, x, device, n=1, warmup=1)  # first-use costs (the profiler's CUDA set-up) not timed
    t0 = time.perf_counter()
    measure(model, x, device, n=1, warmup=0)
    per_round = time.perf_counter() - t0
    rounds = max(3 if quick else 8, min(40, int(budget / max(per_round, 1e-3))))
    times, ratio = measure(model, x, device, n=rounds, warmup=0)
    out = summary(times, ratio)
    out["rounds"] = rounds
    out["name"] = name
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--quick", action="store_true", help="small sizes and few pairs (a CPU check)")
    parser.add_argument(
        "--budget", type=float, help="seconds for the whole run, about (default 180; 30 with --quick)"
    )
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    if args.device == "cpu":
        torch.set_num_threads(1)
    started = time.perf_counter()
    device_name = (
        torch.cuda.get_device_name(torch.device(args.device))
        if args.device.startswith("cuda")
        else platform.processor() or "cpu"
    )
    budget = args.budget if args.budget is not None else (30.0 if args.quick else 180.0)
    share = budget / 10
    pairs = (2, 3) if args.quick else (6, 60)
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": args.device,
        "device_name": device_name,
        "python": platform.python_version(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "loadavg": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "quick": args.quick,
    }
    results: dict[str, Any] = {"info": info}

    def part(key: str, fn: Callable[[], dict]) -> None:
        t0 = time.perf_counter()
        try:
            results[key] = fn()
        except Exception as exc:  # noqa: BLE001 - one failing part must not lose the others
            results[key] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"[{key}: {time.perf_counter() - t0:.1f} s]", file=sys.stderr, flush=True)

    steps = 3 if args.quick else 15
    part("single", lambda: in_block(args.device, 1, share, pairs[0] * 2, pairs[1] * 4, True))
    part("block", lambda: in_block(args.device, steps, share * 1.5, *pairs, True))
    part(
        "block_one_thread", lambda: single_threaded(lambda: in_block(args.device, steps, share, *pairs, True))
    )
    part("block_no_sync", lambda: in_block(args.device, steps, share, *pairs, False))
    part(
        "hook_heavy_peers",
        lambda: peers_row(
            "hook-heavy", *hook_heavy_training(args.device), args.device, share * 2, args.quick
        ),
    )
    layers, width = (2, 256) if args.quick else (8, 1024)
    dtype = torch.bfloat16 if args.device.startswith("cuda") or not args.quick else torch.float32

    def encoder() -> dict:
        model, x = transformer_training(args.device, layers, width, dtype)
        return peers_row(f"TransformerEncoder {layers}x{width}", model, x, args.device, share * 2, args.quick)

    part("encoder_peers", encoder)
    info["seconds"] = time.perf_counter() - started
    print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def markdown(results: dict[str, Any]) -> str:
    info = results["info"]
    out = [
        f"GPU figures: {info['device_name']} (`{info['device']}`), torch {info['torch']} (CUDA {info['cuda']}), "
        f"Python {info['python']}, {info['date_utc']} UTC, load average {info['loadavg']}, "
        f"{info['seconds']:.0f} s{' (--quick)' if info['quick'] else ''}",
        "",
        "| in-block, hook-heavy fwd+bwd | pairs | traced / untraced: median (min-max) | untraced ms/step | traced ms/step |",
        "|---|---|---|---|---|",
    ]
    labels = {
        "single": "1 step a sample, sync each step",
        "block": "15-step block, sync each step",
        "block_one_thread": "15-step block, autograd multithreading off",
        "block_no_sync": "15-step block, no sync per step",
    }
    for key, label in labels.items():
        r = results.get(key, {})
        if "error" in r or not r:
            out.append(f"| {label} | - | {r.get('error', 'not run')} | | |")
            continue
        label = label.replace("15-step", f"{r['steps_per_sample']}-step")
        out.append(
            f"| {label} | {r['pairs']} | {r['ratio_median']:.3f} ({r['ratio_min']:.3f}-{r['ratio_max']:.3f}) "
            f"| {r['untraced_ms_per_step']:.2f} | {r['traced_ms_per_step']:.2f} |"
        )
    out += [
        "",
        "| whole one-step session / untraced step | rounds | hooktrace | ModuleTracker | torch.profiler | untraced ms |",
        "|---|---|---|---|---|---|",
    ]
    for key in ("hook_heavy_peers", "encoder_peers"):
        r = results.get(key, {})
        if "error" in r or not r:
            out.append(f"| {key} | - | {r.get('error', 'not run')} | | | |")
            continue

        def cell(name: str, r: dict = r) -> str:
            lo, hi = r[f"{name}_ratio_min_max"]
            return f"{r[f'{name}_ratio']:.3f} ({lo:.2f}-{hi:.2f})"

        out.append(
            f"| {r['name']} | {r['rounds']} | {cell('hooktrace')} | {cell('module_tracker')} "
            f"| {cell('profiler')} | {r['untraced_ms']:.2f} |"
        )
    out += ["", "Instrumentation of the blocks (medians over pairs):", ""]
    for key in ("block", "block_one_thread", "block_no_sync"):
        r = results.get(key, {})
        if "error" in r or not r:
            continue
        pos = r["step_ms_by_position"]
        out.append(
            f"- `{key}`: step ms by position, untraced {', '.join(f'{v:.2f}' for v in pos['untraced'])}; "
            f"traced {', '.join(f'{v:.2f}' for v in pos['traced'])}. GC passes per block (gen 0/1/2) untraced "
            f"{r['gc_passes_per_block']['untraced']}, traced {r['gc_passes_per_block']['traced']}; GC ms per "
            f"block untraced {r['gc_ms_per_block']['untraced']:.2f}, traced {r['gc_ms_per_block']['traced']:.2f}. "
            f"Events per step {r['events_per_step']}, by thread {r['events_by_thread']}, hook ms by thread "
            f"{ {k: round(v, 2) for k, v in r['hook_ms_by_thread'].items()} }."
        )
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
