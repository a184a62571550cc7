"""A whole one-step session against PyTorch's own observers, side by side in one process (issue 34).

One training step (forward, backward, `optimizer.step()`, `zero_grad()`) run four ways, in rotating
order round after round: untraced; inside `with hooktrace.trace(model) as t:` with the trace built
after the block as `hooktrace.trace()` builds it (`t.trace`: events, hooks and the surprises'
analysis); inside `with torch.utils.module_tracker.ModuleTracker():`; inside
`with torch.profiler.profile():` (CPU activity, plus CUDA when the step runs on a GPU; its exit
collects the profile; reading it as `FunctionEvent`s, `prof.events()`, is not timed: that alone
costs 10-30 untraced hook-heavy steps). Each peer's ratio is its
time over the untraced step of the same round; the rows judge hooktrace's median ratio against
ModuleTracker's median (target: at or below it).

Also used by benchmarks/gpu.py with `device="cuda"` (the step then synchronises at its end).
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any, Callable, Optional

from common import Row

PEERS = ("untraced", "hooktrace", "module_tracker", "profiler")


def _sync(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None


def training_step(model: Any, x: Any, device: str) -> Callable[[], None]:
    """forward + backward + SGD step + zero_grad, synchronised at its end on a GPU."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    sync = _sync(device)

    def step() -> None:
        model(x).float().sum().backward()
        opt.step()
        opt.zero_grad()
        sync()

    return step


def peer_runners(model: Any, step: Callable[[], None], device: str) -> dict[str, Callable[[], float]]:
    """One timed whole session per peer, seconds (the observer's set-up and its result included)."""
    import torch
    from torch.utils.module_tracker import ModuleTracker

    import hooktrace

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    def untraced() -> float:
        t0 = time.perf_counter()
        step()
        return time.perf_counter() - t0

    def ours() -> float:
        t0 = time.perf_counter()
        with hooktrace.trace(model) as session:
            step()
        session.trace  # noqa: B018 - built at first use, as a user's first look at it builds it
        return time.perf_counter() - t0

    def tracker() -> float:
        t0 = time.perf_counter()
        with ModuleTracker():
            step()
        return time.perf_counter() - t0

    def profiler() -> float:
        t0 = time.perf_counter()
        with torch.profiler.profile(activities=activities):
            step()
        return time.perf_counter() - t0

    return {"untraced": untraced, "hooktrace": ours, "module_tracker": tracker, "profiler": profiler}


def rounds(runners: dict[str, Callable[[], float]], n: int) -> dict[str, list[float]]:
    """`n` rounds; each runs every peer once, the order rotating from round to round; seconds."""
    names = list(runners)
    out: dict[str, list[float]] = {name: [] for name in names}
    for i in range(n):
        gc.collect()
        k = i % len(names)
        for name in names[k:] + names[:k]:
            out[name].append(runners[name]())
    return out


def ratios(times: dict[str, list[float]]) -> dict[str, list[float]]:
    base = times["untraced"]
    return {name: [t / u for t, u in zip(ts, base)] for name, ts in times.items() if name != "untraced"}


def measure(
    model: Any, x: Any, device: str = "cpu", n: int = 30, warmup: int = 3
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(seconds, ratios over untraced) per peer, `n` rotating rounds after `warmup` of each."""
    step = training_step(model, x, device)
    runners = peer_runners(model, step, device)
    for _ in range(warmup):
        for run in runners.values():
            run()
    times = rounds(runners, n)
    return times, ratios(times)


def summary(times: dict[str, list[float]], ratio: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {f"{name}_ms": statistics.median(ts) * 1e3 for name, ts in times.items()}
    for name, rs in ratio.items():
        out[f"{name}_ratio"] = statistics.median(rs)
        out[f"{name}_ratio_min_max"] = (min(rs), max(rs))
    return out


def _row(key: str, what: str, model: Any, x: Any, quick: bool, device: str = "cpu") -> Row:
    times, ratio = measure(model, x, device, n=4 if quick else 40, warmup=1 if quick else 3)
    details = summary(times, ratio)
    details["rounds"] = len(times["untraced"])
    # the target is ModuleTracker's own median ratio in the same rounds
    return Row(
        key,
        f"{what}: whole one-step session (open, fwd, bwd, SGD step, close, trace built) / untraced "
        "step; target = ModuleTracker's median ratio in the same rounds",
        "ratio",
        details["module_tracker_ratio"],
        ratio["hooktrace"],
        details=details,
    )


def hook_heavy_training(device: str = "cpu", blocks: int = 150) -> tuple[Any, Any]:
    from capture_rows import hook_heavy_model

    model, _ = hook_heavy_model(blocks)
    import torch

    return model.to(device), torch.randn(32, 64, device=device)


def transformer_training(
    device: str = "cpu", layers: int = 2, d_model: int = 256, dtype: Optional[Any] = None
) -> tuple[Any, Any]:
    """The TransformerEncoder of capture_rows (pre + forward hook on every module), any size."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model, 8, batch_first=True)
    model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def pre(module: nn.Module, args: Any) -> None:
        return None

    def fwd(module: nn.Module, args: Any, output: Any) -> None:
        return None

    for module in model.modules():
        module.register_forward_pre_hook(pre)
        module.register_forward_hook(fwd)
    model = model.to(device=device, dtype=dtype)
    x = torch.randn(4, 64, d_model, device=device, dtype=dtype)
    return model, x


def bench_peers(quick: bool) -> list[Row]:
    model, x = hook_heavy_training()
    heavy = _row("hook_heavy_peers", "hook-heavy 150x(Linear,ReLU), 4 hooks/Linear", model, x, quick)
    model, x = transformer_training()
    enc = _row("transformer_peers", "TransformerEncoder 2x256, pre+fwd hook on every module", model, x, quick)
    return [heavy, enc]
