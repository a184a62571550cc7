#!/usr/bin/env python
"""hooktrace performance benchmarks: every row of the Performance table (issue 5), measured as it says.

    python benchmarks/run.py [--quick] [--json out.json] [--only ROW_ID ...]

Overhead rows are ratios of interleaved traced/untraced pairs in one process, on one thread; the
table shows min / median / max over the pairs and judges the median against the target. `--quick`
runs smaller sizes and fewer repeats (for the smoke test); its numbers are not the targets' numbers.
Memory rows run one subprocess per variant (this script with `--child`).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve()


@dataclass
class Row:
    """One line of the table. `values` are the per-repeat measurements the stats come from."""

    id: str
    what: str
    unit: str
    target: float
    values: list[float] = field(default_factory=list)
    status: str = "ok"  # "ok" | "not measurable"
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def min(self) -> Optional[float]:
        return min(self.values) if self.values else None

    @property
    def median(self) -> Optional[float]:
        return statistics.median(self.values) if self.values else None

    @property
    def max(self) -> Optional[float]:
        return max(self.values) if self.values else None

    @property
    def passed(self) -> Optional[bool]:
        return None if self.median is None else self.median <= self.target

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(min=self.min, median=self.median, max=self.max, passed=self.passed)
        return data


def not_measurable(row: Row, reason: str) -> Row:
    row.status = "not measurable"
    row.note = reason
    row.values = []
    return row


# -- machine ----------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "loadavg_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


# -- helpers ----------------------------------------------------------------------------------------
def _interleaved(untraced: Callable[[], float], traced: Callable[[], Any], pairs: int) -> list[tuple]:
    """`pairs` (untraced, traced) measurements, alternating which runs first (ABBA) to cancel drift."""
    results = []
    for i in range(pairs):
        gc.collect()
        if i % 2 == 0:
            u = untraced()
            t = traced()
        else:
            t = traced()
            u = untraced()
        results.append((u, t))
    return results


def _overhead_rows(
    key: str, what: str, target: float, model: Any, step: Callable[[], None], pairs: int, warmup: int
) -> list[Row]:
    """Two rows: one step inside an open trace (shims only), and a whole `with hooktrace.trace()` block."""
    import hooktrace

    for _ in range(warmup):
        step()
    for _ in range(2):  # warm the capture path too (first session pays import and code-object costs)
        with hooktrace.trace(model):
            step()

    def untraced() -> float:
        t0 = time.perf_counter()
        step()
        return time.perf_counter() - t0

    events = []
    builds = []

    def traced() -> tuple[float, float]:
        t0 = time.perf_counter()
        with hooktrace.trace(model) as session:
            t1 = time.perf_counter()
            step()
            t2 = time.perf_counter()
        t3 = time.perf_counter()
        events.append(len(session.trace.events))  # the trace is built here, at first use
        builds.append(time.perf_counter() - t3)
        return t2 - t1, t3 - t0

    results = _interleaved(untraced, traced, pairs)
    base = statistics.median(u for u, _ in results)
    inner = Row(
        f"{key}_step",
        f"{what}: traced/untraced, one step inside an open trace",
        "ratio",
        target,
        [t[0] / u for u, t in results],
        details={"untraced_ms": base * 1e3, "events_per_step": events[-1], "pairs": pairs},
    )
    whole = Row(
        f"{key}_session",
        f"{what}: traced/untraced, whole `with hooktrace.trace()` around one step",
        "ratio",
        target,
        [t[1] / u for u, t in results],
        details={
            "untraced_ms": base * 1e3,
            "traced_step_ms": statistics.median(t[0] for _, t in results) * 1e3,
            "session_ms": statistics.median(t[1] for _, t in results) * 1e3,
            "trace_build_ms": statistics.median(builds) * 1e3,
            "pairs": pairs,
        },
    )
    per_hook = (statistics.median(t[0] for _, t in results) - base) / max(events[-1], 1)
    inner.details["overhead_per_event_us"] = per_hook * 1e6
    return [inner, whole]


# -- rows 1 and 2: overhead on a model ----------------------------------------------------------------
def hook_heavy_model(blocks: int = 150) -> tuple[Any, Callable[[], None]]:
    """`blocks` x (Linear(64,64), ReLU); each Linear: a pre-hook, two forward hooks, a weight grad hook."""
    import torch
    from torch import nn

    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    model = nn.Sequential(*layers)

    def pre(module: nn.Module, args: Any) -> None:
        return None

    def fwd_a(module: nn.Module, args: Any, output: Any) -> None:
        return None

    def fwd_b(module: nn.Module, args: Any, output: Any) -> None:
        return None

    def grad(g: Any) -> None:
        return None

    for layer in model:
        if isinstance(layer, nn.Linear):
            layer.register_forward_pre_hook(pre)
            layer.register_forward_hook(fwd_a)
            layer.register_forward_hook(fwd_b)
            layer.weight.register_hook(grad)
    x = torch.randn(32, 64)

    def step() -> None:
        model(x).sum().backward()

    return model, step


def transformer_model(layers: int = 2) -> tuple[Any, Callable[[], None]]:
    """TransformerEncoder, d_model 256, 8 heads, batch 4 x 64 tokens; pre + forward hook on every module."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(256, 8, batch_first=True)
    model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def pre(module: nn.Module, args: Any) -> None:
        return None

    def fwd(module: nn.Module, args: Any, output: Any) -> None:
        return None

    for module in model.modules():
        module.register_forward_pre_hook(pre)
        module.register_forward_hook(fwd)
    x = torch.randn(4, 64, 256)

    def step() -> None:
        model(x).sum().backward()

    return model, step


def bench_hook_heavy(quick: bool) -> list[Row]:
    model, step = hook_heavy_model()
    return _overhead_rows(
        "hook_heavy",
        "hook-heavy 150x(Linear,ReLU), 4 hooks/Linear, fwd+bwd",
        1.10,
        model,
        step,
        pairs=6 if quick else 40,
        warmup=2 if quick else 10,
    )


def bench_transformer(quick: bool) -> list[Row]:
    model, step = transformer_model()
    return _overhead_rows(
        "transformer",
        "compute-bound TransformerEncoder 2x256, pre+fwd hook on every module, fwd+bwd",
        1.02,
        model,
        step,
        pairs=6 if quick else 40,
        warmup=2 if quick else 10,
    )


def bench_save_on_cpu(quick: bool) -> list[Row]:
    """The transformer step under `save_on_cpu()`: every saved tensor goes through pack/unpack shims."""
    from torch.autograd.graph import save_on_cpu

    model, plain = transformer_model()

    def step() -> None:
        with save_on_cpu():
            plain()

    pairs, warmup = (6, 2) if quick else (40, 10)
    what = "compute-bound TransformerEncoder 2x256 under save_on_cpu (pack/unpack traced), fwd+bwd"
    return _overhead_rows("save_on_cpu", what, 1.02, model, step, pairs=pairs, warmup=warmup)


# -- row 3: shim overhead -----------------------------------------------------------------------------
def _clear(recorder: Any) -> None:
    """Empty whatever lists the recorder keeps (its layout is the capture's business)."""
    names = getattr(type(recorder), "__slots__", ()) or vars(recorder)
    for name in names:
        value = getattr(recorder, name, None)
        if isinstance(value, list):
            value.clear()


def bench_shim(quick: bool) -> list[Row]:
    from hooktrace.capture.shims import Recorder, make_shim

    def hook(grad: Any) -> None:
        return None

    def fwd_hook(module: Any, args: Any, output: Any) -> None:
        return None

    def passthrough(*args: Any, **kwargs: Any) -> Any:
        return hook(*args, **kwargs)

    rec = Recorder()
    shim = make_shim(rec, hook, 0, "grad", None, False)  # a tensor hook: what the row measures
    fwd_rec = Recorder()
    fwd_shim = make_shim(fwd_rec, fwd_hook, 0, "forward", object(), True)  # a module forward hook
    gen_rec = Recorder()
    gen_shim = make_shim(gen_rec, hook, 0, "state_dict", None, False)  # *args/**kwargs shim
    n = 20_000 if quick else 200_000
    repeats = 3 if quick else 15
    arg = object()

    def loop(fn: Callable[[Any], Any]) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn(arg)
        return time.perf_counter() - t0

    def loop3(fn: Callable[[Any, Any, Any], Any]) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn(arg, arg, arg)
        return time.perf_counter() - t0

    overhead, wrapper, forward, generic = [], [], [], []
    bare_times = []
    for i in range(repeats):
        for r in (rec, fwd_rec, gen_rec):
            _clear(r)
        gc.collect()
        order = [hook, shim, passthrough, gen_shim]
        if i % 2:
            order.reverse()
        times = {fn: loop(fn) for fn in order}
        bare = times[hook]
        bare3 = loop3(fwd_hook)
        fwd = loop3(fwd_shim)
        bare_times.append(bare / n)
        overhead.append((times[shim] - bare) / n * 1e6)
        wrapper.append((times[passthrough] - bare) / n * 1e6)
        generic.append((times[gen_shim] - bare) / n * 1e6)
        forward.append((fwd - bare3) / n * 1e6)
    for r in (rec, fwd_rec, gen_rec):
        _clear(r)
    return [
        Row(
            "shim_overhead",
            "shim overhead per hook call (a tensor-hook shim, make_shim(..., 'grad', ...)), shim - bare call",
            "us",
            0.3,
            overhead,
            details={
                "calls_per_repeat": n,
                "bare_call_us": statistics.median(bare_times) * 1e6,
                "passthrough_wrapper_overhead_us": statistics.median(wrapper),
                "shim_over_passthrough": statistics.median(overhead) / max(statistics.median(wrapper), 1e-9),
                "forward_hook_shim_overhead_us": statistics.median(forward),
                "generic_shim_overhead_us": statistics.median(generic),
            },
        )
    ]


# -- row 4: memory per event (subprocess per variant) ------------------------------------------------
def _rss_now() -> tuple[int, int]:
    """(current RSS, peak RSS) in bytes from /proc/self/status."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            key, value = line.split(":", 1)
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (Linux >= 4.0), so the peak covers only what follows."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _memory_child(variant: str, calls: int, measure: str) -> dict[str, Any]:
    """Run in a fresh process: call a tiny module with two cheap hooks `calls` times (4 events per call).

    `rss`: peak RSS during the loop minus RSS before it (the peak mark is reset first);
    `tracemalloc`: Python allocations still live at the end of the loop minus before it.
    Both are read inside the `with` block, before the trace is finalised.
    """
    import torch
    from torch import nn

    import hooktrace
    import hooktrace.capture  # noqa: F401  (both variants pay the same imports)

    torch.set_num_threads(1)
    model = nn.Sequential(nn.Identity())
    inner = model[0]
    inner.register_forward_pre_hook(lambda m, a: None)
    inner.register_forward_hook(lambda m, a, o: None)
    x = torch.zeros(1)
    for _ in range(100):
        inner(x)

    def loop() -> None:
        with torch.no_grad():
            for _ in range(calls):
                inner(x)

    def measured() -> None:
        gc.collect()
        if measure == "tracemalloc":
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            loop()
            out["bytes"] = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
        else:
            out["peak_reset"] = _reset_peak()
            before = _rss_now()[0]
            loop()
            out["bytes"] = _rss_now()[1] - before

    out: dict[str, Any] = {"variant": variant, "measure": measure, "events": 0}
    if variant == "traced":
        with hooktrace.trace(model) as session:
            measured()
        out["events"] = len(session.trace.events)
    else:
        measured()
    return out


def _run_child(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(HERE), "--child", *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory child {args} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_memory(quick: bool) -> list[Row]:
    calls = 10_000 if quick else 125_000  # 4 events per call: 40k / 500k events
    repeats = 1 if quick else 3
    per_event, py_per_event = [], []
    events = 0
    for _ in range(repeats):
        untraced = _run_child("untraced", str(calls), "rss")
        traced = _run_child("traced", str(calls), "rss")
        events = traced["events"]
        per_event.append((traced["bytes"] - untraced["bytes"]) / events)
    for _ in range(repeats):
        untraced = _run_child("untraced", str(calls), "tracemalloc")
        traced = _run_child("traced", str(calls), "tracemalloc")
        py_per_event.append((traced["bytes"] - untraced["bytes"]) / traced["events"])
    return [
        Row(
            "memory_per_event",
            f"memory per recorded event while tracing (peak RSS traced - untraced, {events} events)",
            "B",
            200.0,
            per_event,
            details={"events": events, "tracemalloc_bytes_per_event": statistics.median(py_per_event)},
        )
    ]


# -- row 5: save + load of 1M events ------------------------------------------------------------------
def synthetic_trace(n_events: int) -> Any:
    """A Trace shaped like a real one: 300 transformer-like module paths, 600 hooks, enter/hook/exit runs."""
    from hooktrace.schema import Event, Hook, Meta, Module, Trace

    subs = ("self_attn", "self_attn.out_proj", "linear1", "dropout", "linear2", "norm1", "norm2", "dropout1")
    paths = [""] + [f"layers.{i}.{sub}" for i in range(38) for sub in subs][:300]
    modules = [Module(p, "Linear" if p else "TransformerEncoder") for p in paths]
    hooks = [
        Hook(
            id=10 + i,
            kind=("forward_pre", "forward", "forward", "grad")[i % 4],
            scope="tensor" if i % 4 == 3 else "module",
            module=paths[1 + i // 4 % 300],
            name=f"hook_{i % 4}",
            defined_at=f"model.py:{10 + i % 4}",
            registered_at=f"model.py:{40 + i % 4}",
        )
        for i in range(600)
    ]
    tid = 140_245_819_283_264
    events = []
    t = 1_000_000
    for seq in range(n_events):
        r = seq % 6
        path = paths[1 + (seq // 6) % 300]
        t += 1_350
        if r == 0:
            ev = Event(seq, 0, "enter", "forward", path, None, None, tid, t, 41_000, False, None)
        elif r == 5:
            ev = Event(seq, 0, "exit", "forward", path, None, None, tid, t, 0, False, None)
        else:
            kind = ("forward_pre", "forward", "forward", "grad")[r - 1]
            phase = "backward" if kind == "grad" else "forward"
            ev = Event(
                seq, 0, "hook", phase, path, 10 + (seq // 6 % 150) * 4 + r - 1, kind, tid, t, 712, False, None
            )
        events.append(ev)
    return Trace(
        meta=Meta(torch="2.13.0", python="3.11.9", target="bench.py:make"),
        modules=modules,
        hooks=hooks,
        events=events,
    )


def bench_save_load(quick: bool, tmp: Path) -> list[Row]:
    """`save` + `load` of the synthetic trace against orjson dumping and loading the same events as
    rows of 12 values, interleaved pairs in this process (the order alternates). Wall time is the
    row; the CPU time of this process (less disturbed by other load on the machine) is a detail.
    The orjson baseline runs as a caller would run it, with the cyclic GC on; the ratio against a
    GC-paused orjson (which `save`/`load` themselves pause) is a detail too."""
    import orjson

    import hooktrace

    n = 50_000 if quick else 1_000_000
    pairs = 1 if quick else 5
    trace = synthetic_trace(n)
    rows = [list(e) for e in trace.events]
    path = tmp / "big.json"
    ratios, cpu_ratios, paused_ratios, saves, loads = [], [], [], [], []
    loaded_events = 0

    def baseline(paused: bool) -> tuple[float, float]:
        gc.collect()
        if paused:
            gc.disable()
        w0, c0 = time.perf_counter(), time.process_time()
        orjson.loads(orjson.dumps(rows))
        w1, c1 = time.perf_counter(), time.process_time()
        gc.enable()
        return w1 - w0, c1 - c0

    def ours() -> tuple[float, float]:
        nonlocal loaded_events
        gc.collect()
        w0, c0 = time.perf_counter(), time.process_time()
        trace.save(path)
        w1 = time.perf_counter()
        loaded = hooktrace.load(path)
        w2, c2 = time.perf_counter(), time.process_time()
        loaded_events = len(loaded.events)
        saves.append(w1 - w0)
        loads.append(w2 - w1)
        return w2 - w0, c2 - c0

    for i in range(pairs):
        if i % 2:
            (w, c), (bw, bc) = ours(), baseline(False)
        else:
            (bw, bc), (w, c) = baseline(False), ours()
        ratios.append(w / bw)
        cpu_ratios.append(c / bc)
        paused_ratios.append(w / baseline(True)[0])
    size = path.stat().st_size
    version = hooktrace.schema.VERSION
    trace.save(tmp / "big.json.gz")
    gz_size = (tmp / "big.json.gz").stat().st_size
    path.unlink()
    (tmp / "big.json.gz").unlink()
    note = "" if loaded_events == n else f"loaded {loaded_events} of {n} events"
    return [
        Row(
            "save_load",
            f"save + load of a {n:,}-event trace (version {version}) / orjson dumps + loads of the same rows",
            "x",
            1.0,
            ratios,
            note=note,
            details={
                "events": n,
                "save_s": statistics.median(saves),
                "load_s": statistics.median(loads),
                "cpu_ratio": statistics.median(cpu_ratios),
                "ratio_to_gc_paused_orjson": statistics.median(paused_ratios),
            },
        ),
        Row(
            "file_size",
            f"trace file size per event, {n:,} events, version {version}",
            "B/event",
            60.0,
            [size / n],
            details={"MB": size / 1e6, "gzip_MB": gz_size / 1e6},
        ),
    ]


def _small_trace(path: Path) -> None:
    import torch
    from torch import nn

    import hooktrace

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    model[0].register_forward_hook(lambda m, a, o: None)
    with hooktrace.trace(model) as session:
        model(torch.randn(2, 4)).sum().backward()
    session.save(str(path))


def _time_cmd(cmd: list[str]) -> tuple[float, int, str]:
    """Wall time, exit code and the last stderr line (a Python traceback means the command is broken)."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    seconds = time.perf_counter() - t0
    crashed = "Traceback (most recent call last)" in proc.stderr
    return seconds, proc.returncode, proc.stderr.strip().splitlines()[-1] if crashed else ""


_IMPORTS_TORCH = (
    "import sys\nfrom hooktrace.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
    "sys.__stderr__.write('HOOKTRACE_TORCH=%d' % ('torch' in sys.modules))\n"
)


def _imports_torch(args: list[str]) -> Optional[bool]:
    proc = subprocess.run([sys.executable, "-c", _IMPORTS_TORCH, *args], capture_output=True, text=True)
    marker = proc.stderr.rsplit("HOOKTRACE_TORCH=", 1)
    return marker[1].strip() == "1" if len(marker) == 2 else None


def bench_cli(quick: bool, tmp: Path) -> list[Row]:
    runs = 1 if quick else 5
    a, b = tmp / "a.json", tmp / "b.json"
    _small_trace(a)
    _small_trace(b)
    exe = shutil.which("hooktrace")
    prefix = [exe] if exe else [sys.executable, "-m", "hooktrace"]
    commands = {
        "cli_help": ["--help"],
        "cli_render": ["render", str(a)],
        "cli_diff": ["diff", str(a), str(b)],
    }
    rows = {
        key: Row(key, f"`hooktrace {args[0]}` start-up / `python -c 'import torch'`", "ratio", 0.15)
        for key, args in commands.items()
    }
    try:
        import hooktrace.cli  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (a broken CLI is a finding, not a crash of the benchmark)
        return [not_measurable(r, f"hooktrace.cli does not import: {exc}") for r in rows.values()]
    torch_times: list[float] = []
    cmd_times: dict[str, list[float]] = {key: [] for key in commands}
    codes: dict[str, set[int]] = {key: set() for key in commands}
    crashes: dict[str, str] = {}
    for _ in range(runs):  # interleaved, so drift hits every command alike
        torch_times.append(_time_cmd([sys.executable, "-c", "import torch"])[0])
        for key, args in commands.items():
            seconds, code, crash = _time_cmd(prefix + args)
            cmd_times[key].append(seconds)
            codes[key].add(code)
            if crash:
                crashes[key] = crash
    torch_s = statistics.median(torch_times)
    for key, args in commands.items():
        row = rows[key]
        bad = codes[key] - {0, 1}
        if bad or key in crashes:
            not_measurable(row, f"the command fails: exit {sorted(codes[key])}, {crashes.get(key, '')}")
            continue
        row.values = [s / torch_s for s in cmd_times[key]]
        row.details = {
            "median_s": statistics.median(cmd_times[key]),
            "import_torch_s": torch_s,
            "imports_torch": _imports_torch(args),
            "exit_codes": sorted(codes[key]),
        }
    return list(rows.values())


# -- row 7: tree / SVG render of a 24-layer transformer ------------------------------------------------
def transformer_trace(layers: int) -> Any:
    """One fwd+bwd of TransformerEncoder(`layers`, 256, 8 heads); pre, forward, full backward hooks."""
    import warnings

    import torch
    from torch import nn

    import hooktrace

    torch.manual_seed(0)
    model = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(256, 8, batch_first=True), layers, enable_nested_tensor=False
    )
    for module in model.modules():
        module.register_forward_pre_hook(lambda m, a: None)
        module.register_forward_hook(lambda m, a, o: None)
        module.register_full_backward_hook(lambda m, gi, go: None)
    x = torch.randn(4, 64, 256)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with hooktrace.trace(model) as session:
            model(x).sum().backward()
    return session.trace


def bench_render(quick: bool) -> list[Row]:
    layers = 4 if quick else 24
    repeats = 1 if quick else 3
    rows = [
        Row("render_tree", f"tree render of a {layers}-layer TransformerEncoder trace", "s", 1.0),
        Row("render_svg", f"SVG render of a {layers}-layer TransformerEncoder trace", "s", 10.0),
    ]
    try:
        from hooktrace.render import render
    except ImportError as exc:
        return [not_measurable(r, f"hooktrace.render.render does not exist yet ({exc})") for r in rows]
    trace = transformer_trace(layers)
    for row, fmt in zip(rows, ("tree", "svg")):
        row.details = {"events": len(trace.events), "hooks": len(trace.hooks)}
        try:
            for _ in range(repeats):
                gc.collect()
                t0 = time.perf_counter()
                out = render(trace, fmt)
                row.values.append(time.perf_counter() - t0)
            row.details["output_chars"] = len(out)
        except Exception as exc:  # noqa: BLE001
            not_measurable(row, f"render(trace, {fmt!r}) raised {type(exc).__name__}: {exc}")
    return rows


# -- table ------------------------------------------------------------------------------------------
BENCHES: dict[str, Callable[..., list[Row]]] = {
    "hook_heavy": bench_hook_heavy,
    "transformer": bench_transformer,
    "save_on_cpu": bench_save_on_cpu,
    "shim": bench_shim,
    "memory": bench_memory,
    "save_load": bench_save_load,
    "cli": bench_cli,
    "render": bench_render,
}
NEEDS_TMP = {"save_load", "cli"}
GROUPS = {
    "hook_heavy": ("hook_heavy_step", "hook_heavy_session"),
    "transformer": ("transformer_step", "transformer_session"),
    "save_on_cpu": ("save_on_cpu_step", "save_on_cpu_session"),
    "shim": ("shim_overhead",),
    "memory": ("memory_per_event",),
    "save_load": ("save_load", "file_size"),
    "cli": ("cli_help", "cli_render", "cli_diff"),
    "render": ("render_tree", "render_svg"),
}


def _fmt(value: Optional[float]) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}"


def table(rows: list[Row], info: dict[str, Any]) -> str:
    head = ("row", "unit", "min", "median", "max", "target", "result")
    lines = [head]
    for r in rows:
        result = "n/a" if r.status != "ok" else ("PASS" if r.passed else "FAIL")
        lines.append((r.id, r.unit, _fmt(r.min), _fmt(r.median), _fmt(r.max), f"<= {_fmt(r.target)}", result))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = [
        f"machine: {info['cpu']}, {info['cores']} cores, {info['implementation']} {info['python']}, "
        f"torch {info['torch']} ({info['torch_threads']} thread), {info['platform']}, "
        f"load average at start {info['loadavg_at_start']}"
    ]
    for i, line in enumerate(lines):
        out.append(
            "  ".join(
                cell.ljust(widths[j]) if j == 0 else cell.rjust(widths[j]) for j, cell in enumerate(line)
            )
        )
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    out.append("")
    for r in rows:
        extra = ", ".join(f"{k}={_fmt(v) if isinstance(v, float) else v}" for k, v in r.details.items())
        out.append(f"{r.id}: {r.what}" + (f" [{r.note}]" if r.note else "") + (f"; {extra}" if extra else ""))
    return "\n".join(out)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats (smoke test)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHES), help="run only these groups")
    parser.add_argument("--child", nargs=3, metavar=("VARIANT", "CALLS", "MEASURE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_memory_child(args.child[0], int(args.child[1]), args.child[2])))
        return 0

    import torch

    torch.set_num_threads(1)
    info = machine()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="hooktrace-bench-") as tmp:
        for name, bench in BENCHES.items():
            if args.only and name not in args.only:
                continue
            t0 = time.perf_counter()
            try:
                rows.extend(bench(args.quick, Path(tmp)) if name in NEEDS_TMP else bench(args.quick))
            except Exception as exc:  # noqa: BLE001  (one broken group must not hide the others)
                reason = f"benchmark raised {type(exc).__name__}: {exc}"
                rows.extend(
                    not_measurable(Row(row_id, name, "", math.nan), reason) for row_id in GROUPS[name]
                )
            print(f"[{name}: {time.perf_counter() - t0:.1f} s]", file=sys.stderr, flush=True)
    print(table(rows, info))
    if args.json:
        args.json.write_text(
            json.dumps({"machine": info, "quick": args.quick, "rows": [r.as_json() for r in rows]}, indent=2)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
