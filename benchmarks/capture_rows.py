"""Rows that time tracing itself: overhead ratios of real steps, the shim, memory per event."""

from __future__ import annotations

import gc
import json
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable

from common import HERE, Row, _overhead_rows


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
        quick,
    )


def bench_transformer(quick: bool) -> list[Row]:
    model, step = transformer_model()
    return _overhead_rows(
        "transformer",
        "compute-bound TransformerEncoder 2x256, pre+fwd hook on every module, fwd+bwd",
        1.02,
        model,
        step,
        quick,
    )


def bench_save_on_cpu(quick: bool) -> list[Row]:
    """The transformer step under `save_on_cpu()`: every saved tensor goes through pack/unpack shims."""
    from torch.autograd.graph import save_on_cpu

    model, plain = transformer_model()

    def step() -> None:
        with save_on_cpu():
            plain()

    what = "compute-bound TransformerEncoder 2x256 under save_on_cpu (pack/unpack traced), fwd+bwd"
    return _overhead_rows("save_on_cpu", what, 1.02, model, step, quick)


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
    fwd_shim = make_shim(fwd_rec, fwd_hook, 0, "forward", object(), False)  # module hook, module bound
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
