"""What every benchmark row shares: the Row record, the machine, interleaved pairs, the table."""

from __future__ import annotations

import gc
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve().parent / "run.py"  # the script the memory rows run as a child


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
    key: str,
    what: str,
    target: float,
    model: Any,
    step: Callable[[], None],
    quick: bool,
) -> list[Row]:
    """Two rows: steps inside an open trace (the capture's cost per step), and a whole `with
    hooktrace.trace()` block around one step (install, recording the hooks held, the final walk: the session's).

    The step row's samples are `reps` consecutive steps each (untraced, or inside one fresh trace),
    so that one sample lasts long enough for this VM's millisecond hiccups to average out; its pairs
    are interleaved separately from the session row's. `quick`: fewer pairs and shorter samples.
    """
    import hooktrace

    pairs, warmup, reps = (6, 2, 2) if quick else (40, 10, 5)

    for _ in range(warmup):
        step()
    for _ in range(2):  # warm the capture path too (first session pays import and code-object costs)
        with hooktrace.trace(model):
            step()

    def untraced_steps(n: int = reps) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        return (time.perf_counter() - t0) / n

    events = []

    def traced_steps() -> float:
        with hooktrace.trace(model) as session:
            t1 = time.perf_counter()
            for _ in range(reps):
                step()
            t2 = time.perf_counter()
        events.append(len(session.trace.events) // reps)
        return (t2 - t1) / reps

    builds = []

    def traced_session() -> float:
        t0 = time.perf_counter()
        with hooktrace.trace(model) as session:
            step()
        t3 = time.perf_counter()
        session.trace  # noqa: B018 - the trace is built here, at first use
        builds.append(time.perf_counter() - t3)
        return t3 - t0

    steps = _interleaved(untraced_steps, traced_steps, pairs)
    base = statistics.median(u for u, _ in steps)
    traced_ms = statistics.median(t for _, t in steps)
    inner = Row(
        f"{key}_step",
        f"{what}: traced/untraced, steps inside an open trace ({reps} per sample)",
        "ratio",
        target,
        [t / u for u, t in steps],
        details={
            "untraced_ms": base * 1e3,
            "traced_ms": traced_ms * 1e3,
            "events_per_step": events[-1],
            "overhead_per_event_us": (traced_ms - base) / max(events[-1], 1) * 1e6,
            "pairs": pairs,
            "steps_per_sample": reps,
        },
    )
    sessions = _interleaved(lambda: untraced_steps(1), traced_session, pairs)
    whole = Row(
        f"{key}_session",
        f"{what}: traced/untraced, whole `with hooktrace.trace()` around one step",
        "ratio",
        target,
        [t / u for u, t in sessions],
        details={
            "untraced_ms": statistics.median(u for u, _ in sessions) * 1e3,
            "session_ms": statistics.median(t for _, t in sessions) * 1e3,
            "trace_build_ms": statistics.median(builds) * 1e3,
            "pairs": pairs,
        },
    )
    return [inner, whole]


# -- rows 1 and 2: overhead on a model ----------------------------------------------------------------


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
